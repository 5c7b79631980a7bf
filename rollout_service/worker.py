"""The rollout worker: claims trajectories, runs episodes, records results.

Each claimed trajectory runs as its own task; its slot frees when its episode ends, so the
next claim overlaps the result's write (`free_slots`). Where episodes are as short as a claim's
round trip (a fast engine), the worker also holds a few claims ahead (`ahead`), so a slot that
frees starts its next episode at once instead of waiting on Redis; it claims them half at a time,
so one claim is in flight while the last one's episodes run. One heartbeat loop per
worker extends every lease the worker holds in one round trip (`Queue.heartbeat_many`), so
100k trajectories in flight cost a few calls a period, not 100k; a beat that runs late (a busy
event loop) extends them for longer (`stretched_lease`). The heartbeat also carries cancellation: when
the batch is cancelled the episode is cancelled and recorded as such. Each turn the episode
goes on after is recorded under the lease as it finishes (`Queue.append_turn`), so a crash
loses at most the turn in progress (the last turn comes with the result). If the lease is
lost (this worker stalled past its TTL and another took over), the episode is dropped
without writing: the first result wins.

Infrastructure failures (engine, env, internal) are given back to the queue while the
trajectory has attempts left; after that they are recorded as failed with their kind.
Losing a peer is different: when an engine or env worker is unreachable (it died or is
restarting), or Redis is away or answers an error (a failover in progress), the episode is
restarted from scratch with the same seeds and counted as a restart, never charged to the
trajectory's attempts (the queue's larger `max_restarts` stops poison work). Redis going
away never kills the worker: every Redis call backs off and tries again, and a result waits
for Redis to return (within its lease).
Any worker also reaps expired leases, so no separate reaper process is needed.
A worker told to stop leaves nothing leased behind: claims not yet running and episodes cut
short go back to the queue, uncharged, and results already on their way are let land
(`HAND_BACK_S` each; if Redis is away then too, the leases lapse and are reaped instead).

An idle worker does not poll: it blocks on the queue's wake list (`Queue.wait`), which every
submission and requeue pushes to, and claims as many trajectories as it has free slots in one
call (`Queue.claim_many`: fair share across tenants, a GRPO group's members together).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass

from env_workers.client import EnvBackend, EnvWorkerLost
from rollout_service.engines.base import EngineLost
from rollout_service.engines.fleet import Fleet
from rollout_service.rollout import run_episode
from scheduler.connection import REDIS_FAULT, UNAVAILABLE, Backoff, cancel_point
from scheduler.forecast import Forecaster, Mean
from scheduler.keys import batch_of
from scheduler.lifecycle import Lifecycle
from scheduler.queue import LEASE_LOST, LEASE_OK, Claim, LeaseLost, Queue
from scheduler.store import Store
from wire import Failure, FailureKind, Trajectory, TrajectoryState, Turn

log = logging.getLogger(__name__)

# Lost peers, or Redis in trouble: the episode restarts, uncharged (see the module docstring).
LOST = (EngineLost, EnvWorkerLost, *REDIS_FAULT)


@dataclass(slots=True)
class _Live:
    """A running episode as the heartbeat loop sees it; `verdict` is what the last heartbeat
    said when it ended the episode (LEASE_LOST, BATCH_CANCELLED)."""

    claim: Claim
    task: asyncio.Task  # the handler running the episode
    verdict: int = LEASE_OK
    in_episode: bool = True  # False once the episode ended: then only its result is being written
    slot: float | None = None  # when it took one of the worker's `concurrency` episode slots


# At shutdown, what is held goes back to the queue now rather than when its lease lapses: each
# hand-back, and the results already being written, get this long (then their leases lapse instead).
HAND_BACK_S = 5.0

# Most trajectories one claim call takes: the script runs alone in Redis, so a worker with
# 25,000 free slots fills them a few hundred at a time rather than stall every other client.
CLAIM_MOST = 256


def stretched_lease(base_s: float, previous_s: float, late_s: float) -> float:
    """How long a heartbeat extends the leases: `base_s`, or 3x how late this beat ran (a busy
    event loop, say a burst of finishing episodes) so lateness is not taken for death, at most
    4 leases; a stretch wears off by 10% a beat."""
    return min(max(base_s, previous_s * 0.9, 3 * late_s), 4 * base_s)


class Slots:
    """`n` slots, taken first come first served, in O(1) (`asyncio.Semaphore` looks at each of its
    waiters to tell whether it is locked: with claims held ahead, dozens wait)."""

    def __init__(self, n: int):
        self.free = n
        self._waiters: collections.deque[asyncio.Future] = collections.deque()

    async def take(self) -> None:
        if self.free > 0 and not self._waiters:
            self.free -= 1
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # handed a slot as the cancel landed: pass it on
                self.give()
            raise

    def give(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():  # (a cancelled waiter is done)
                fut.set_result(None)
                return
        self.free += 1


class LoopDied(RuntimeError):
    """A background loop of the worker ended: the process must exit so it is restarted."""


class Worker:
    def __init__(self, queue: Queue, store: Store, fleet: Fleet, envs: EnvBackend, *,
                 worker_id: str | None = None, concurrency: int = 16, idle_wait_s: float = 1.0,
                 retry_backoff_s: float = 0.5, registry=None, release_on_start: bool = False,
                 prefetch: int | None = None):
        self.queue, self.store, self.fleet, self.envs = queue, store, fleet, envs
        self.id = worker_id or f"worker-{uuid.uuid4().hex[:8]}"
        # With a stable id, a restarted worker requeues its dead predecessor's work at start.
        self.release_on_start = release_on_start
        self.concurrency = concurrency
        # Claims held beyond `concurrency`, waiting for a slot (`ahead`): at most this many.
        self.prefetch = concurrency if prefetch is None else prefetch
        self._slots = Slots(concurrency)  # episodes running; first come first served, so claims start in order
        self._claim_s = Mean(cap=10)  # a claim call's round trip (recent: the last ~10 weigh most)
        self._episode_s = Mean(cap=10)  # an episode, from its slot to its end
        # Longest an idle worker blocks on the queue's wake list before looking again: bounds how
        # late it notices a dead background loop; new work wakes it at once.
        self.idle_wait_s = idle_wait_s
        self.heartbeat_s = max(queue.lease_s / 3, 0.05)
        self.retry_backoff_s = retry_backoff_s  # doubles per attempt
        self.registry = registry  # where engine loads and health are reported for everyone to see
        # Every live trajectory's phase, feeding the forecaster of prefill/decode demand.
        self.forecaster = Forecaster()
        self.lifecycle = Lifecycle(observers=[self.forecaster])
        self._active: set[asyncio.Task] = set()
        # The handler running each trajectory here. A lease can lapse while its holder still runs
        # (Redis away longer than the lease, a failover that lost the lease): the trajectory is
        # requeued and may come back to this same worker while the old episode still runs.
        self._handlers: dict[str, asyncio.Task] = {}
        self._live: dict[str, _Live] = {}  # by lease token: what the heartbeat loop renews
        # Handlers whose episode has ended and whose result is being written: their slot is free
        # (the next claim overlaps the write), up to as many again as `concurrency`.
        self._writing: set[asyncio.Task] = set()
        self._slot_freed = asyncio.Event()
        self._waiting_for_engines = False  # (said once per wait: `_engines_ready`)
        self.finished = 0

    async def run(self, stop: asyncio.Event) -> None:
        reaper = asyncio.create_task(self._reap_forever(stop))
        prober = asyncio.create_task(self._probe_forever(stop))
        beater = asyncio.create_task(self._heartbeat_forever(stop))
        backoff = Backoff()
        try:
            while self.release_on_start and not stop.is_set():
                try:
                    requeued, failed = await self.queue.release(self.id)
                    if requeued or failed:
                        log.warning("gave back a dead predecessor's work", extra={
                            "worker_id": self.id, "requeued": requeued, "failed": failed})
                    break
                except UNAVAILABLE:
                    await backoff.wait()
            event_loop = asyncio.get_running_loop()
            pending: asyncio.Future | None = None  # a claim sent before the last claim's episodes started
            while not stop.is_set():
                cancel_point()
                for loop in (reaper, prober, beater):
                    if loop.done():
                        raise LoopDied(f"background loop {loop.get_coro().__name__} ended") from (
                            None if loop.cancelled() else loop.exception())
                if pending is None:
                    free = self.free_slots()
                    if not free:  # full: until a slot frees (O(1), however many run)
                        self._slot_freed.clear()
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(1.0):
                                await self._slot_freed.wait()
                        continue
                    if not await self._engines_ready(stop):
                        continue
                    pending = asyncio.ensure_future(self._claim(free))
                try:
                    claims = await pending
                    pending = None
                    if not claims:
                        await self._wait_for_work(stop)
                except UNAVAILABLE:
                    pending = None
                    log.warning("Redis unavailable; waiting to claim work")
                    await backoff.wait()
                    continue
                backoff.reset()
                more = self.free_slots() - len(claims)
                if claims and more > 0:  # claims held ahead: Redis takes the next ones while these run
                    pending = asyncio.ensure_future(self._claim(more))
                    # redis-py sends from a task of its own: one turn of the loop puts the send
                    # ahead of these episodes (instant ones would run first, all of them).
                    await asyncio.sleep(0)
                for claim in claims:  # (each handler takes itself out of `_active` as it ends: `_ended`)
                    self._active.add(event_loop.create_task(self._handle(claim)))
        finally:
            if pending is not None:  # claimed but never started: hand back now, uncharged
                await self._give_back(pending)
            # Handlers made in the loop's last pass start now: one cancelled before it ever ran
            # could not hand its trajectory back, which would stay leased until reaped.
            await asyncio.sleep(0)
            for t in (reaper, prober, beater):
                t.cancel()
            handlers = list(self._active)
            for t in handlers:  # an episode cancelled hands its trajectory back, uncharged (`_run`)
                if t not in self._writing:
                    t.cancel()
            # A finished episode's result is let land (a round trip); cancelled, its write could be
            # dropped with the loop, and the trajectory would stay leased until reaped.
            if handlers:
                await asyncio.wait(handlers, timeout=HAND_BACK_S)
            for t in handlers:
                t.cancel()
            await asyncio.gather(*handlers, reaper, prober, beater, return_exceptions=True)

    async def _engines_ready(self, stop: asyncio.Event) -> bool:
        """Whether the fleet's engines (registered, of a kind this worker speaks) can serve a turn:
        one takes prefills and one decodes. If not, wait a second and say so (once): claimed now,
        every trajectory would spend its attempts in a second and fail as `engine` (a batch
        submitted while the engines still load); it stays queued instead. The registry is read at
        most every few seconds; a read that fails leaves what was read before (Redis away: the
        claim that follows finds out; any other failure: the prober logs it), never ends the loop."""
        with contextlib.suppress(Exception):
            await self.fleet.refresh()
        if self.fleet.serves_turns():
            if self._waiting_for_engines:
                log.info("engines can serve turns; claiming work", extra={"engines": self.fleet.engine_ids})
                self._waiting_for_engines = False
            return True
        if not self._waiting_for_engines:
            log.warning("no engine registered that this worker can use for a whole turn (none, or none that "
                        "prefills or decodes); waiting before claiming work")
            self._waiting_for_engines = True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await stop.wait()
        return False

    async def _claim(self, n: int) -> list[Claim]:
        """Up to `n` (at most CLAIM_MOST) in one call: a GRPO group's members come together.
        With claims held ahead, at most half of what may be held: the next claim goes out as
        this one's episodes start, so one is always in flight (taking all of it in one call, a
        worker ran every episode it held, then waited on Redis for the finishes and the next claim)."""
        ahead = self.ahead()
        if ahead:
            n = min(n, max((self.concurrency + ahead) // 2, 1))
        sent = time.monotonic()
        claims = await self.queue.claim_many(self.id, min(n, CLAIM_MOST))
        self._claim_s.add(time.monotonic() - sent)
        return claims

    async def _give_back(self, pending: asyncio.Future) -> None:
        """The worker stops with a claim in flight: what it claimed goes back to the queue now,
        uncharged, rather than when its leases lapse (if Redis is away, they lapse instead)."""
        with contextlib.suppress(Exception, asyncio.CancelledError):
            claims = await asyncio.wait_for(asyncio.shield(pending), HAND_BACK_S)
            await asyncio.gather(*(self._hand_back(c) for c in claims))
        if not pending.done():
            pending.cancel()

    async def _hand_back(self, claim: Claim) -> None:
        """The worker stops: `claim` goes back to the queue now, uncharged (if Redis is away too,
        its lease lapses instead)."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.queue.restart(claim), HAND_BACK_S)

    def free_slots(self) -> int:
        """How many more trajectories to claim: `concurrency` run at once, and `ahead()` more wait
        for a slot; a slot frees when its episode ends, while its result is still being written
        (at most as many again writing)."""
        ahead = self.ahead()
        running = len(self._active) - len(self._writing)  # (and waiting for a slot)
        return max(0, min(self.concurrency + ahead - running, 2 * (self.concurrency + ahead) - len(self._active)))

    def ahead(self) -> int:
        """Claims to hold beyond the running episodes: as many slots as free up in two claim round
        trips at the recent pace (concurrency x round trip / episode), so a slot that frees starts
        its next episode without waiting on Redis. Episodes of milliseconds (a fast engine) keep
        up to `prefetch` ahead; episodes of seconds keep none, so no worker sits on work another
        could run."""
        if not self.prefetch or not self._claim_s.n or not self._episode_s.n:
            return 0
        want = 2 * self.concurrency * self._claim_s.value / max(self._episode_s.value, 1e-6)
        return min(self.prefetch, int(want + 0.5))

    def _episode_over(self, live: _Live) -> None:
        live.in_episode = False
        if live.slot is not None:
            self._episode_s.add(time.monotonic() - live.slot)
            live.slot = None
            self._slots.give()
        self._writing.add(live.task)
        self._slot_freed.set()

    def _ended(self, task: asyncio.Task) -> None:
        """A handler ends (called by itself, last: a done callback costs a turn of the loop each;
        one cancelled before it ever ran, at shutdown, stays until the shutdown gathers it)."""
        self._active.discard(task)
        self._writing.discard(task)
        self._slot_freed.set()

    async def _wait_for_work(self, stop: asyncio.Event) -> None:
        """Block on the queue's wake list (a submission or requeue wakes us within a round trip)
        until `idle_wait_s`, or until told to stop."""
        waiter = asyncio.create_task(self.queue.wait(self.idle_wait_s))
        waiter.add_done_callback(lambda t: t.cancelled() or t.exception())  # read even if we are cancelled
        stopper = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            waiter.cancel()  # no-op once done; redis-py drops a blocked connection rather than reuse it
            # `asyncio.wait`, not `await helper` under suppress(CancelledError): a cancel of this
            # task that lands here (the worker's shutdown) must propagate, not pass for a helper's.
            await asyncio.wait({waiter, stopper})
        if not waiter.cancelled() and waiter.exception() is not None:
            raise waiter.exception()  # a Redis error, for the caller's back-off

    async def _reap_forever(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                requeued, failed = await self.queue.reap()
                if requeued or failed:
                    log.warning("reaped expired leases", extra={"requeued": requeued, "failed": failed})
            except UNAVAILABLE:
                log.warning("reap skipped: Redis unavailable")
            except Exception:  # a reaper hiccup must not stop the worker
                log.exception("reap failed")
            cancel_point()
            await asyncio.sleep(min(self.heartbeat_s, 0.5))  # also releases due retries

    async def _probe_forever(self, stop: asyncio.Event, every_s: float = 2.0) -> None:
        """Engine health checks: a dead engine leaves rotation within `every_s`."""
        while not stop.is_set():
            try:
                await self.fleet.probe()
                await self.queue.report_expected(self.forecaster.expected_s())  # for longest-first
                if self.registry is not None:
                    await self.registry.report(self.id, self.fleet.loads(), set(self.fleet.down))
                    d = self.forecaster.forecast(self.lifecycle.live(), time.monotonic())
                    await self.registry.report_phases(self.id, {  # summed over workers: Demand.from_report
                        **{f"phase:{ph.value}": n for ph, n in self.lifecycle.counts().items()}, **d.report()})
            except UNAVAILABLE:
                log.warning("engine probe skipped: Redis unavailable")
            except Exception:
                log.exception("engine probe failed")
            cancel_point()
            await asyncio.sleep(every_s)

    async def _write(self, claim: Claim, what: str, call) -> bool | None:
        """Run a token-guarded queue write, riding out a Redis outage for up to one lease
        (after that the lease has lapsed and the reaper owns the trajectory). None: gave up."""
        deadline = time.monotonic() + self.queue.lease_s
        backoff = None  # (made on the first failure: nearly every write succeeds at once)
        while True:
            cancel_point()
            try:
                return await call()
            except UNAVAILABLE:
                backoff = backoff or Backoff()
                if time.monotonic() > deadline:
                    log.warning("Redis away for a whole lease; the reaper will requeue",
                                extra={"trajectory_id": claim.trajectory_id, "write": what})
                    return None
                await backoff.wait()

    async def _restart(self, claim: Claim, why: str, kind: FailureKind = FailureKind.internal, work=None) -> None:
        if claim.restarts >= self.queue.max_restarts:  # the peer never came back: give up, as data
            traj = _failed_stub(claim, kind, f"{why} (still so after {claim.restarts} restarts)", work)
            await self._write(claim, "complete", lambda: self.queue.complete(claim, traj))
            return
        log.warning("restarting the episode: a peer was lost", extra={
            "trajectory_id": claim.trajectory_id, "restarts": claim.restarts, "reason": why})
        delay = min(0.25 * 2 ** claim.restarts, 5.0)  # let a restarting engine or env worker come back
        await self._write(claim, "restart", lambda: self.queue.restart(claim, delay_s=delay))

    async def _complete(self, claim: Claim, traj: Trajectory, work) -> bool | None:
        """Record the result; one that cannot be stored (a value msgpack cannot hold, say a string
        with a lone surrogate from an env) is recorded as failed instead, with the reason, its task
        dropped if the task is what cannot be stored: it never vanishes to come back from the reaper
        for ever. A Redis error propagates (`_handle` logs it; the lease lapses and is reaped)."""
        try:
            return await self._write(claim, "complete", lambda: self.queue.complete(claim, traj))
        except REDIS_FAULT:
            raise
        except Exception as e:
            log.exception("result could not be stored; recorded as failed",
                          extra={"trajectory_id": claim.trajectory_id})
            why = f"the result could not be stored: {e!r}"
        stub = _failed_stub(claim, FailureKind.internal, why, work)
        try:
            return await self._write(claim, "complete", lambda: self.queue.complete(claim, stub))
        except REDIS_FAULT:
            raise
        except Exception:  # the task itself: the batch's request still has it (GET .../request)
            stub.task = {}
            return await self._write(claim, "complete", lambda: self.queue.complete(claim, stub))

    async def _append_turn(self, claim: Claim, turn: Turn) -> None:
        """Record a finished turn durably; LeaseLost when another worker owns the trajectory.
        Redis away for a whole lease: the turn stays only in memory (the reaper owns it by then)."""
        await self._write(claim, "turn", lambda: self.queue.append_turn(claim, turn))

    async def _heartbeat_forever(self, stop: asyncio.Event) -> None:
        """Renew every lease held here each `heartbeat_s`; end the episodes whose lease was
        lost or whose batch was cancelled. A Redis outage is ridden out: episodes keep running."""
        lease_s = self.queue.lease_s
        while not stop.is_set():
            slept = time.monotonic()
            await asyncio.sleep(self.heartbeat_s)
            cancel_point()
            late = time.monotonic() - slept - self.heartbeat_s
            if late > self.heartbeat_s / 2:  # this loop runs late: lease for longer, up to 4 leases
                log.warning("event loop running late; leases renewed for longer", extra={
                    "late_s": round(late, 1), "trajectories": len(self._live)})
            lease_s = stretched_lease(self.queue.lease_s, lease_s, late)
            live = list(self._live.values())  # every trajectory held here, until its result is written
            if not live:
                continue
            try:
                verdicts = await self.queue.heartbeat_many([x.claim for x in live], lease_s)
            except UNAVAILABLE:
                log.warning("heartbeat failed: Redis unavailable", extra={"trajectories": len(live)})
                continue
            except Exception:  # an error reply (a failover): the next beat tries again, within the lease
                log.exception("heartbeat failed", extra={"trajectories": len(live)})
                continue
            for x, verdict in zip(live, verdicts):
                if verdict != LEASE_OK and x.in_episode:  # (a result being written fails on its own)
                    x.verdict = verdict
                    x.task.cancel()

    async def _handle(self, claim: Claim) -> None:
        tid = claim.trajectory_id
        me = asyncio.current_task()
        older = self._handlers.get(tid)
        self._handlers[tid] = me
        try:
            if older is not None and not older.done():  # its lease is gone: the new claim supersedes it
                log.warning("claimed again while an older episode still ran; dropping the older one",
                            extra={"trajectory_id": tid})
                older.cancel()
                await asyncio.wait({older})
            try:
                work = await self.store.work(tid, claim)
            except asyncio.CancelledError:  # the worker stops while the batch's parameters load
                await self._hand_back(claim)
                raise
            except REDIS_FAULT as e:  # Redis away or failing over between claim and load: not the trajectory's
                await self._restart(claim, f"cannot load: {e!r}")
                return
            except Exception as e:  # unreadable spec: record it, never loop on it
                log.exception("cannot load trajectory", extra={"trajectory_id": tid})
                await self._write(claim, "complete", lambda: self.queue.complete(
                    claim, _failed_stub(claim, FailureKind.internal, f"cannot load: {e!r}")))
                return
            live = self._live[claim.token] = _Live(claim, me)
            try:
                await self._run(claim, work, live)
            except Exception:  # never silently: its lease lapses and the reaper requeues it
                log.exception("could not record the trajectory; its lease will lapse and it is requeued",
                              extra={"trajectory_id": tid})
            finally:
                del self._live[claim.token]  # heartbeated until its result is written, not only while it runs
        finally:
            if self._handlers.get(tid) is me:
                del self._handlers[tid]
            self._ended(me)

    async def _run(self, claim: Claim, work, live: _Live) -> None:
        """The episode, then its result, retry or restart written under the lease."""
        try:  # the episode runs in this task: the heartbeat loop cancels it here, with a verdict
            await self._slots.take()
            live.slot = time.monotonic()
            traj = await run_episode(work, self.fleet, self.envs, claim.attempt, self.lifecycle, claim.restarts,
                                     lambda turn: self._append_turn(claim, turn))
        except asyncio.CancelledError:
            self._episode_over(live)
            if live.verdict == LEASE_OK:  # the worker shuts down: hand the trajectory back now, uncharged
                await self._hand_back(claim)
                raise
            asyncio.current_task().uncancel()
            if live.verdict == LEASE_LOST:
                log.warning("lease lost; dropping the result", extra={"trajectory_id": claim.trajectory_id})
                return
            traj = _failed_stub(claim, FailureKind.cancelled, "batch cancelled", work)
            traj.state = TrajectoryState.cancelled
        except LeaseLost:  # a turn could not be recorded: another worker owns the trajectory now
            self._episode_over(live)
            log.warning("lease lost; dropping the episode", extra={"trajectory_id": claim.trajectory_id})
            return
        except LOST as e:
            self._episode_over(live)
            kind = FailureKind.engine if isinstance(e, EngineLost) else \
                FailureKind.env if isinstance(e, EnvWorkerLost) else FailureKind.internal
            await self._restart(claim, f"{type(e).__name__}: {e}", kind, work)
            return
        except Exception as e:
            self._episode_over(live)
            log.exception("episode crashed", extra={"trajectory_id": claim.trajectory_id})
            traj = _failed_stub(claim, FailureKind.internal, f"episode crashed: {e!r}", work)
        else:
            self._episode_over(live)
        if (traj.state is TrajectoryState.failed and traj.failure and traj.failure.kind.retryable
                and claim.attempt < self.queue.max_attempts):
            log.info("retrying after an infrastructure failure", extra={
                "trajectory_id": claim.trajectory_id, "batch_id": traj.batch_id, "attempt": claim.attempt,
                "failure_kind": traj.failure.kind.value, "failure": traj.failure.message})
            delay = min(self.retry_backoff_s * 2 ** (claim.attempt - 1), 30.0)
            await self._write(claim, "retry", lambda: self.queue.retry(claim, delay_s=delay))
            return
        if await self._complete(claim, traj, work):
            self.finished += 1
            if log.isEnabledFor(logging.INFO):  # (the fields cost a little: a worker finishes thousands a second)
                log.info("trajectory finished", extra={
                    "trajectory_id": traj.id, "batch_id": traj.batch_id, "state": traj.state.value,
                    "reward": traj.reward, "turns": len(traj.turns),
                    "sampled_tokens": sum(len(t.output_ids) for t in traj.turns),
                    "active_s": round(traj.active_s, 3), "attempt": claim.attempt, "restarts": claim.restarts,
                    "failure_kind": traj.failure.kind.value if traj.failure else None})


def _failed_stub(claim: Claim, kind: FailureKind, message: str, work=None) -> Trajectory:
    return Trajectory(
        id=claim.trajectory_id, batch_id=work.batch_id if work else batch_of(claim.trajectory_id),
        group_index=work.group_index if work else 0, sample_index=work.sample_index if work else 0,
        env=work.params.env if work else "", task=work.task if work else {}, state=TrajectoryState.failed,
        failure=Failure(kind=kind, message=message), attempts=claim.attempt, restarts=claim.restarts,
    )
