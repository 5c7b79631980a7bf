"""Workers against a real Redis: whole batches, cancellation, retries, a worker dying."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time

import pytest

from rollout_service.engines.base import EngineError
from rollout_service.engines.sim import SimEngine
from scheduler.queue import Queue
from scheduler.store import Store
from tests.conftest import RunningWorker
from wire import FailureKind, RolloutRequest, TrajectoryState


async def wait_done(store: Store, bid: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        st = await store.batch_status(bid)
        if st.finished_at is not None:
            return st
        assert time.monotonic() < deadline, f"batch not done: {st.counts}"
        await asyncio.sleep(0.05)


async def test_worker_runs_a_calc_batch(settings, redis, keys):
    q, store = Queue(redis, keys), Store(redis, keys)
    b = await q.enqueue(RolloutRequest(tasks=[{"seed": i} for i in range(4)], env="calc", group_size=4))
    with RunningWorker(settings):
        st = await wait_done(store, b.id)
    assert st.counts[TrajectoryState.completed] + st.counts[TrajectoryState.truncated] == 16
    trajs, _ = await store.trajectories(b.id, 0, 100)
    assert all(t.turns and len(t.token_ids) == len(t.loss_mask) for t in trajs)
    assert any(len(t.turns) > 1 for t in trajs)  # the toy policy used the calculator somewhere


async def test_cancel_stops_running_trajectories(settings, redis, keys):
    slow = {"slow": (SimEngine("slow", time_scale=2000.0), "byte")}
    q, store = Queue(redis, keys), Store(redis, keys)
    b = await q.enqueue(RolloutRequest(tasks=[{"seed": 1}], env="calc", group_size=4))
    with RunningWorker(settings, engines=slow):
        while (await store.batch_status(b.id)).counts[TrajectoryState.running] < 4:
            await asyncio.sleep(0.05)
        t0 = time.monotonic()
        await q.cancel(b.id)
        st = await wait_done(store, b.id, timeout=10)
        elapsed = time.monotonic() - t0
    assert st.state.value == "cancelled" and st.counts[TrajectoryState.cancelled] == 4
    assert elapsed < settings.lease_s * 2  # within a heartbeat or two, not a lease expiry
    t = await store.trajectory(f"{b.id}-0-0")
    assert t.failure.kind is FailureKind.cancelled


async def test_one_heartbeat_renews_every_lease_a_worker_holds(settings, redis, keys, monkeypatch):
    """Episodes longer than the lease (2 s here) keep it through the worker's one heartbeat loop,
    which renews all of them in one call per beat (not one call per trajectory)."""
    sizes = []
    real = Queue.heartbeat_many

    async def counted(self, claims, *args):
        sizes.append(len(claims))
        return await real(self, claims, *args)

    monkeypatch.setattr(Queue, "heartbeat_many", counted)
    slow = {"slow": (SimEngine("slow", time_scale=25.0), "byte")}  # ~4 s an episode: two leases
    q, store = Queue(redis, keys), Store(redis, keys)
    b = await q.enqueue(RolloutRequest(tasks=[{"seed": i} for i in range(8)], env="math",
                                       sampling={"max_tokens": 16}))
    with RunningWorker(settings, engines=slow, concurrency=8):
        st = await wait_done(store, b.id, timeout=60)
    trajs, _ = await store.trajectories(b.id, 0, 100)
    assert st.counts[TrajectoryState.completed] + st.counts[TrajectoryState.truncated] == 8
    assert max(t.active_s for t in trajs) > settings.lease_s  # an episode outlived its first lease...
    assert all(t.restarts == 0 and t.attempts == 1 for t in trajs)  # ...and kept it
    assert max(sizes) == 8  # every lease held, in one call


async def test_a_result_slow_to_write_keeps_its_lease(settings, redis, keys, monkeypatch):
    """The episode ended but its result takes longer than a lease to write (a slow blob store, a
    starved worker): the heartbeat goes on renewing it meanwhile, so it is not run again."""
    real = Queue.complete  # (inline results are written by the finishing call itself: held here)

    async def slow(self, *args):
        await asyncio.sleep(2.5 * settings.lease_s)
        return await real(self, *args)

    monkeypatch.setattr(Queue, "complete", slow)
    q, store = Queue(redis, keys), Store(redis, keys)
    b = await q.enqueue(RolloutRequest(tasks=[{"seed": 1}], env="math"))
    with RunningWorker(settings):
        st = await wait_done(store, b.id, timeout=60)
    t = await store.trajectory(f"{b.id}-0-0")
    assert st.counts[TrajectoryState.completed] == 1 and t.restarts == 0 and t.attempts == 1



async def test_a_slot_frees_when_its_episode_ends_while_its_result_is_written(settings, redis, keys, monkeypatch):
    """The next claim overlaps a result's write: `concurrency` episodes run at once, and up to
    as many again may be writing their results (never more)."""
    real, gate, writing, most = Queue.complete, [], [0], [0]  # (the result's write, held)

    async def held(self, *args):  # each write waits until four are being written (or 20 s)
        if not gate:
            gate.append(asyncio.Event())
        writing[0] += 1
        most[0] = max(most[0], writing[0])
        if writing[0] >= 4:
            gate[0].set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(gate[0].wait(), 20)
        writing[0] -= 1
        return await real(self, *args)

    monkeypatch.setattr(Queue, "complete", held)
    q, store = Queue(redis, keys), Store(redis, keys)
    b = await q.enqueue(RolloutRequest(tasks=[{"seed": i} for i in range(6)], env="math"))
    with RunningWorker(settings, concurrency=2, prefetch=0):  # (no claims held ahead: see the next tests)
        st = await wait_done(store, b.id, timeout=60)
    assert st.counts[TrajectoryState.completed] == 6
    assert most[0] == 4  # 2 episodes' slots were reused while their results waited; 2 x concurrency at most

async def test_slots_go_in_order_and_a_waiter_cancelled_as_it_gets_one_passes_it_on():
    from rollout_service.worker import Slots

    s = Slots(1)
    await s.take()
    a, b, c = (asyncio.create_task(s.take()) for _ in range(3))
    await asyncio.sleep(0)
    a.cancel()  # cancelled while waiting: skipped
    await asyncio.sleep(0)
    s.give()  # the slot goes to b, the first still waiting
    await asyncio.sleep(0)
    assert b.done() and not b.cancelled() and not c.done() and s.free == 0
    s.give()  # handed to c...
    c.cancel()  # ...as its cancel lands: c passes the slot on
    with contextlib.suppress(asyncio.CancelledError):
        await c
    assert c.cancelled() and s.free == 1
    await s.take()  # (taken at once)
    assert s.free == 0


def test_claims_are_held_ahead_only_while_episodes_are_short_beside_a_claims_round_trip():
    from types import SimpleNamespace

    from rollout_service.worker import Worker

    w = Worker(SimpleNamespace(lease_s=30.0), None, None, None, concurrency=8)
    assert w.ahead() == 0  # nothing measured yet
    w._claim_s.add(0.001)
    w._episode_s.add(0.002)  # an instant engine: half the slots free up during one claim
    assert w.ahead() == 8  # 2 x 8 x 0.5, at most `prefetch` (= concurrency by default)
    w._episode_s.value = 0.016
    assert w.ahead() == 1  # 2 x 8 x 1/16
    w._episode_s.value = 2.0  # a real engine: nothing waits on the claim
    assert w.ahead() == 0 and w.free_slots() == 8
    w._episode_s.value = 0.002
    w.prefetch = 3
    assert w.ahead() == 3 and w.free_slots() == 11
    assert Worker(SimpleNamespace(lease_s=30.0), None, None, None, concurrency=8, prefetch=0).ahead() == 0


async def test_a_worker_holds_claims_ahead_of_instant_episodes_and_runs_each_once(settings, redis, keys, monkeypatch):
    """Instant episodes: the worker holds more leases than it runs episodes (the next ones wait
    for a slot, not for Redis), never runs more than `concurrency` at once, and every
    trajectory completes once."""
    from rollout_service import worker as worker_mod

    held, running, most_running = [0], [0], [0]
    real_run = worker_mod.run_episode

    async def counted(*args, **kw):
        running[0] += 1
        most_running[0] = max(most_running[0], running[0])
        try:
            return await real_run(*args, **kw)
        finally:
            running[0] -= 1

    real_free = worker_mod.Worker.free_slots

    def free_slots(self):
        held[0] = max(held[0], len(self._active) - len(self._writing))  # running, or claimed and waiting
        return real_free(self)

    monkeypatch.setattr(worker_mod, "run_episode", counted)
    monkeypatch.setattr(worker_mod.Worker, "free_slots", free_slots)
    q, store = Queue(redis, keys), Store(redis, keys)
    b = await q.enqueue(RolloutRequest(tasks=[{"seed": i} for i in range(300)], env="math"))
    engine = SimEngine("sim-0", seed=1, time_scale=1e-3)  # an episode sleeps ~0.6 ms: they overlap
    with RunningWorker(settings, engines={"sim-0": (engine, "byte")}, concurrency=2):
        st = await wait_done(store, b.id, timeout=120)
    trajs, _ = await store.trajectories(b.id, 0, 400)
    assert st.counts[TrajectoryState.completed] == 300 and len({t.id for t in trajs}) == 300
    assert all(t.attempts == 1 and t.restarts == 0 for t in trajs)
    assert most_running[0] == 2 and held[0] > 2


async def test_with_claims_held_ahead_the_next_claim_goes_out_while_episodes_are_still_to_run(
        settings, redis, keys, monkeypatch):
    """Instant episodes: a claim takes at most half of what may be held, so the next one is sent
    as its episodes start and Redis answers it while they run. (Taking everything in one call, a
    worker ran every episode it held, then sat waiting on Redis with nothing to run.)"""
    from rollout_service import worker as worker_mod

    started, overlaps = [0], []
    real_claim, real_run = worker_mod.Worker._claim, worker_mod.run_episode

    async def counted(*args, **kw):
        started[0] += 1
        return await real_run(*args, **kw)

    async def claim(self, n):
        before = started[0]
        got = await real_claim(self, n)
        if got:  # (an idle worker's claims, woken by stale wakes at the end, find nothing)
            overlaps.append(started[0] - before)  # episodes that started while this claim was in flight
        return got

    monkeypatch.setattr(worker_mod, "run_episode", counted)
    monkeypatch.setattr(worker_mod.Worker, "_claim", claim)
    monkeypatch.setattr(worker_mod.Worker, "ahead", lambda self: 8)  # (the rule itself: the test above)
    q, store = Queue(redis, keys), Store(redis, keys)
    b = await q.enqueue(RolloutRequest(tasks=[{"seed": i} for i in range(2000)], env="math"))
    with RunningWorker(settings, engines={"sim-0": (SimEngine("sim-0", seed=1), "byte")}, concurrency=8):
        st = await wait_done(store, b.id, timeout=120)
    assert st.counts[TrajectoryState.completed] == 2000
    overlapped = sum(n > 0 for n in overlaps[1:])
    assert len(overlaps) > 100 and overlapped >= 0.9 * (len(overlaps) - 1), (overlapped, len(overlaps))  # before: none


async def test_a_stopping_worker_hands_back_every_claim_it_holds_ahead(settings, redis, keys, monkeypatch):
    """Stopped mid-batch with claims held ahead (some claimed and waiting for a slot, one claim
    maybe in flight): nothing stays leased to it, nothing is charged an attempt, and a second
    worker finishes the batch, each trajectory once."""
    from rollout_service import worker as worker_mod

    real_free, ahead_seen = worker_mod.Worker.free_slots, [0]

    def free_slots(self):
        ahead_seen[0] = max(ahead_seen[0], len(self._active) - len(self._writing) - self.concurrency)
        return real_free(self)

    monkeypatch.setattr(worker_mod.Worker, "free_slots", free_slots)
    monkeypatch.setattr(worker_mod.Worker, "ahead", lambda self: 4)  # (the rule itself: the test above)
    q, store = Queue(redis, keys), Store(redis, keys)
    b = await q.enqueue(RolloutRequest(tasks=[{"seed": i} for i in range(3000)], env="math"))
    engine = SimEngine("sim-0", seed=1, time_scale=1e-3)
    with RunningWorker(settings, engines={"sim-0": (engine, "byte")}, concurrency=4):
        while ahead_seen[0] < 1 or (await store.batch_status(b.id)).counts[TrajectoryState.completed] < 50:
            assert (await store.batch_status(b.id)).finished_at is None, "the batch ended before the stop"
            await asyncio.sleep(0.01)
    st = await store.batch_status(b.id)
    assert st.counts[TrajectoryState.running] == 0 and await redis.zcard(keys.leases) == 0
    assert st.counts[TrajectoryState.completed] < 3000  # stopped mid-batch
    with RunningWorker(settings, concurrency=16):
        st = await wait_done(store, b.id, timeout=120)
    trajs, _ = await store.trajectories(b.id, 0, 4000)
    assert st.counts[TrajectoryState.completed] == 3000 and len({t.id for t in trajs}) == 3000
    assert all(t.attempts == 1 for t in trajs)


@pytest.mark.parametrize("stop_at", ["claim", "result"])
async def test_a_worker_stopped_as_a_claim_returns_or_a_result_is_written_leaves_nothing_leased(
        settings, redis, keys, monkeypatch, stop_at):
    """The worker is told to stop at the worst moment: as a claim returns (its handlers made, not
    yet run) or as an episode's result starts on its way to Redis. Once its process ends, nothing
    is leased to it, nothing was charged an attempt, and a second worker finishes the batch, each
    trajectory once. (Both windows left a trajectory leased until reaped: a handler cancelled
    before it ever ran, a result write dropped with the loop.)"""
    from rollout_service import worker as worker_mod

    q, store = Queue(redis, keys), Store(redis, keys)
    b = await q.enqueue(RolloutRequest(tasks=[{"seed": i} for i in range(200)], env="math"))
    rw = RunningWorker(settings, engines={"sim-0": (SimEngine("sim-0", seed=1, time_scale=1e-3), "byte")},
                       concurrency=4)
    stopped = []
    if stop_at == "claim":
        real_claim = worker_mod.Worker._claim

        async def claim(self, n):
            got = await real_claim(self, n)
            if got and not stopped:
                stopped.append(len(got))
                rw.stop.set()
            return got

        monkeypatch.setattr(worker_mod.Worker, "_claim", claim)
    else:
        real_complete = Queue.complete

        async def complete(self, claim, traj):
            if not stopped:
                stopped.append(claim.trajectory_id)
                rw.stop.set()
                await asyncio.sleep(0.05)  # the worker's loop sees the stop while this result is on its way
            return await real_complete(self, claim, traj)

        monkeypatch.setattr(Queue, "complete", complete)
    with rw:
        rw.thread.join(60)
    assert stopped and not rw.thread.is_alive()
    st = await store.batch_status(b.id)
    assert st.counts[TrajectoryState.running] == 0 and await redis.zcard(keys.leases) == 0
    assert st.counts[TrajectoryState.completed] >= (1 if stop_at == "result" else 0)  # (that result landed)
    monkeypatch.undo()
    with RunningWorker(settings, concurrency=16):
        st = await wait_done(store, b.id, timeout=120)
    trajs, _ = await store.trajectories(b.id, 0, 400)
    assert st.counts[TrajectoryState.completed] == 200 and len({t.id for t in trajs}) == 200
    assert all(t.attempts == 1 for t in trajs)


def test_a_late_heartbeat_stretches_the_leases_and_the_stretch_wears_off():
    from rollout_service.worker import stretched_lease

    assert stretched_lease(30.0, 30.0, 0.2) == 30.0  # on time: the lease
    assert stretched_lease(30.0, 30.0, 15.0) == 45.0  # 15 s late: 3x that
    assert stretched_lease(30.0, 30.0, 90.0) == 120.0  # never past 4 leases
    wearing = [45.0]
    for _ in range(6):
        wearing.append(stretched_lease(30.0, wearing[-1], 0.0))
    assert wearing[1] == 40.5 and wearing[-1] == 30.0  # back to the lease in a few beats


class FlakyEngine(SimEngine):
    """Fails the first `n` requests, then behaves."""

    def __init__(self, n: int):
        super().__init__("flaky")
        self.left = n

    async def generate(self, req):
        if self.left > 0:
            self.left -= 1
            raise EngineError("transient")
        return await super().generate(req)


async def test_infrastructure_failure_is_retried_then_recorded(settings, redis, keys):
    q, store = Queue(redis, keys, max_attempts=settings.max_attempts), Store(redis, keys)
    # 3 engine attempts per turn x 1 trajectory attempt fail, the second trajectory attempt succeeds
    b = await q.enqueue(RolloutRequest(tasks=[{"seed": 1}], env="math"))
    with RunningWorker(settings, engines={"flaky": (FlakyEngine(3), "byte")}):
        await wait_done(store, b.id)
    t = await store.trajectory(f"{b.id}-0-0")
    assert t.state is TrajectoryState.completed and t.attempts == 2

    b2 = await q.enqueue(RolloutRequest(tasks=[{"seed": 1}], env="math"))
    with RunningWorker(settings, engines={"flaky": (FlakyEngine(10**6), "byte")}):
        await wait_done(store, b2.id)
    t2 = await store.trajectory(f"{b2.id}-0-0")
    assert t2.state is TrajectoryState.failed and t2.failure.kind is FailureKind.engine
    assert t2.attempts == settings.max_attempts and t2.failure.kind.infrastructure and not t2.usable


async def test_a_result_that_cannot_be_stored_is_recorded_as_failed_saying_why(settings, redis, keys, monkeypatch):
    """A value msgpack cannot hold (here a string with a lone surrogate, as a third-party env could
    put in `info`) made the result's write raise: the handler died unlogged, the lease lapsed and
    the reaper requeued the trajectory, again and again. Now it is recorded as failed at once, with
    the reason; where the task itself cannot be stored, without it."""
    import rollout_service.worker as worker_module
    from scheduler import queue as queue_module

    real = worker_module.run_episode

    async def unstorable(work, *args, **kwargs):
        if work.task.get("seed") == 2:  # a task that slipped past the gateway's checks
            work.task["bad"] = "\udfff"
        traj = await real(work, *args, **kwargs)
        traj.info = {"note": "\ud800"}
        return traj

    monkeypatch.setattr(worker_module, "run_episode", unstorable)
    requeues = []
    real_reap = queue_module.Queue.reap

    async def reap(self):
        got = await real_reap(self)
        requeues.append(got[0])
        return got

    monkeypatch.setattr(queue_module.Queue, "reap", reap)
    q, store = Queue(redis, keys), Store(redis, keys)
    b = await q.enqueue(RolloutRequest(tasks=[{"seed": 1}, {"seed": 2}], env="math"))
    with RunningWorker(settings):
        st = await wait_done(store, b.id)
    assert st.counts[TrajectoryState.failed] == 2 and not any(requeues)
    one, two = await store.trajectory(f"{b.id}-0-0"), await store.trajectory(f"{b.id}-1-0")
    for t in (one, two):
        assert t.failure.kind is FailureKind.internal and "could not be stored" in t.failure.message
        assert "surrogate" in t.failure.message and t.attempts == 1 and t.restarts == 0
    assert one.task == {"seed": 1} and two.task == {}


async def test_a_task_with_an_integer_beyond_64_bits_finishes_and_reads_back_exact(settings, redis, keys):
    """Such a task (a math answer of 2**100) was stuck `running`: its result could not be packed,
    the handler died unlogged, and the reaper requeued it for ever (restart after restart)."""
    q, store = Queue(redis, keys), Store(redis, keys)
    b = await q.enqueue(RolloutRequest(tasks=[{"seed": 1, "big": 2**100, "neg": -(2**70)}], env="math"))
    with RunningWorker(settings):
        st = await wait_done(store, b.id)
    t = await store.trajectory(f"{b.id}-0-0")
    assert t.state in (TrajectoryState.completed, TrajectoryState.truncated) and st.counts[TrajectoryState.failed] == 0
    assert t.task == {"seed": 1, "big": 2**100, "neg": -(2**70)} and t.restarts == 0


async def test_dead_workers_trajectory_is_picked_up_by_another(settings, redis, keys):
    settings = dataclasses.replace(settings, lease_s=1.5, max_attempts=5)
    q, store = Queue(redis, keys, settings.lease_s, settings.max_attempts), Store(redis, keys)
    b = await q.enqueue(RolloutRequest(tasks=[{"seed": 1}], env="math"))
    hung = {"hung": (SimEngine("hung", time_scale=10**6), "byte")}
    w1 = RunningWorker(settings, engines=hung).__enter__()
    while (await store.batch_status(b.id)).counts[TrajectoryState.running] == 0:
        await asyncio.sleep(0.02)
    # Worker 1 stalls as a hung or SIGSTOPped process does: its loop runs nothing, so it neither
    # heartbeats nor gives the trajectory back. (Cancelling its tasks instead is a shutdown: it
    # hands the work back, and under load a cancel could land where the handler went on.)
    frozen = threading.Event()
    w1.loop.call_soon_threadsafe(frozen.wait)
    try:
        with RunningWorker(settings):
            st = await wait_done(store, b.id)
    finally:
        frozen.set()  # it wakes to a lost lease and drops its episode
        w1.__exit__()
    assert st.counts[TrajectoryState.completed] == 1
    t = await store.trajectory(f"{b.id}-0-0")
    # the dead worker cost a restart, never one of the trajectory's attempts
    assert t.attempts == 1 and t.restarts >= 1 and t.turns[0].engine_id == "sim-0"


async def test_group_status_counts_usable_members_and_retries_failures(settings, redis, keys):
    """One member's engine failure is retried, not dropped: the group ends fully usable."""
    q, store = Queue(redis, keys, max_attempts=3), Store(redis, keys)
    b = await q.enqueue(RolloutRequest(tasks=[{"seed": 1}, {"seed": 2}], env="math", group_size=3))
    groups = await store.groups(b.id)
    assert [(g.size, g.done, g.usable) for g in groups] == [(3, 0, 0), (3, 0, 0)]
    with RunningWorker(settings, engines={"flaky": (FlakyEngine(3), "byte")}, concurrency=1):
        await wait_done(store, b.id)
    groups = await store.groups(b.id)
    assert [(g.size, g.done, g.usable, g.failed) for g in groups] == [(3, 3, 3, 0), (3, 3, 3, 0)]
    assert all(r is not None for g in groups for r in g.rewards)
    retried = [t for t in (await store.trajectories(b.id, 0, 10))[0] if t.attempts > 1]
    assert len(retried) == 1  # the member that met the failing engine ran again


async def test_deadline_counts_active_time_not_time_queued(settings, redis, keys):
    q, store = Queue(redis, keys), Store(redis, keys)
    b = await q.enqueue(RolloutRequest(tasks=[{"seed": 1}], env="math", deadline_s=0.5))
    await asyncio.sleep(0.8)  # queued longer than the deadline: must not count
    with RunningWorker(settings):
        await wait_done(store, b.id)
    t = await store.trajectory(f"{b.id}-0-0")
    assert t.state is TrajectoryState.completed and t.active_s < 0.5

    slow = {"slow": (SimEngine("slow", time_scale=50.0), "byte")}
    b2 = await q.enqueue(RolloutRequest(tasks=[{"seed": 1}], env="math", deadline_s=0.3))
    with RunningWorker(settings, engines=slow):
        await wait_done(store, b2.id)
    t2 = await store.trajectory(f"{b2.id}-0-0")
    assert t2.state is TrajectoryState.failed and t2.failure.kind is FailureKind.timeout


class LostEngine(SimEngine):
    """Unreachable for the first `n` requests (as while its process restarts), then fine."""

    def __init__(self, n: int):
        super().__init__("lost")
        self.left = n

    async def generate(self, req):
        if self.left > 0:
            self.left -= 1
            from rollout_service.engines.base import EngineLost

            raise EngineLost("engine lost unreachable: connection refused")
        return await super().generate(req)


async def test_a_lost_engine_restarts_the_episode_without_charging_an_attempt(settings, redis, keys):
    q, store = Queue(redis, keys), Store(redis, keys)
    b = await q.enqueue(RolloutRequest(tasks=[{"seed": 1}], env="math"))
    with RunningWorker(settings, engines={"lost": (LostEngine(3 * 4), "byte")}):  # 4 episodes' worth of failover
        await wait_done(store, b.id)
    t = await store.trajectory(f"{b.id}-0-0")
    assert t.state is TrajectoryState.completed and (t.attempts, t.restarts) == (1, 4)


class ReadOnlyOnce(SimEngine):
    """Raises the error reply a demoted primary gives (READONLY) from its first `n` turns: an
    error Redis raised mid-episode, as a turn's write does during a failover."""

    def __init__(self, id: str, n: int):
        super().__init__(id)
        self.left = n

    async def generate(self, req):
        if self.left > 0:
            self.left -= 1
            import redis.exceptions

            raise redis.exceptions.ReadOnlyError("You can't write against a read only replica.")
        return await super().generate(req)


async def test_a_redis_error_reply_mid_episode_restarts_it_without_charging_an_attempt(settings, redis, keys):
    q, store = Queue(redis, keys), Store(redis, keys)
    b = await q.enqueue(RolloutRequest(tasks=[{"seed": 1}], env="math"))
    with RunningWorker(settings, engines={"ro": (ReadOnlyOnce("ro", 2), "byte")}):
        await wait_done(store, b.id)
    t = await store.trajectory(f"{b.id}-0-0")
    assert t.state is TrajectoryState.completed and (t.attempts, t.restarts) == (1, 2)


async def test_a_peer_that_never_returns_fails_after_max_restarts_with_its_kind(settings, redis, keys):
    settings = dataclasses.replace(settings, max_restarts=2)
    q, store = Queue(redis, keys), Store(redis, keys)
    b = await q.enqueue(RolloutRequest(tasks=[{"seed": 1}], env="math"))
    with RunningWorker(settings, engines={"lost": (LostEngine(10**6), "byte")}):
        await wait_done(store, b.id)
    t = await store.trajectory(f"{b.id}-0-0")
    assert t.state is TrajectoryState.failed and t.failure.kind is FailureKind.engine
    assert "after 2 restarts" in t.failure.message and (t.attempts, t.restarts) == (1, 2)


def always_calc(prompt_text, rng) -> str:
    return "calc: 2 + 2"  # never answers: every episode runs max_turns turns


class StallAfter(SimEngine):
    """Serves `n` turns, then hangs (an engine stuck mid-turn)."""

    def __init__(self, id: str, n: int):
        super().__init__(id, policy=always_calc)
        self.left = n

    async def generate(self, req):
        if self.left <= 0:
            await asyncio.sleep(10**6)
        self.left -= 1
        return await super().generate(req)


async def test_turns_are_durable_as_they_finish_and_a_rerun_does_not_mix_them(settings, redis, keys):
    settings = dataclasses.replace(settings, lease_s=1.5)
    q, store = Queue(redis, keys, settings.lease_s), Store(redis, keys)
    b = await q.enqueue(RolloutRequest(tasks=[{"seed": 1}], env="calc", max_turns=3))
    tid = f"{b.id}-0-0"
    w1 = RunningWorker(settings, engines={"first": (StallAfter("first", 2), "byte")}).__enter__()
    deadline = time.monotonic() + 20
    while len((t := await store.trajectory(tid)).turns) < 2:
        assert time.monotonic() < deadline, f"turns never showed while running: {t.state}"
        await asyncio.sleep(0.02)
    # Readable while the third turn is stuck in the engine.
    assert t.state is TrajectoryState.running and [x.index for x in t.turns] == [0, 1]
    assert all(x.engine_id == "first" and x.output_ids for x in t.turns)
    # The worker dies mid-turn: what it recorded is not mixed into the rerun's turns.
    w1.loop.call_soon_threadsafe(lambda: [task.cancel() for task in asyncio.all_tasks(w1.loop)])
    w1.thread.join(5)
    second = {"second": (SimEngine("second", policy=always_calc), "byte")}
    with RunningWorker(settings, engines=second):
        await wait_done(store, b.id)
    t = await store.trajectory(tid)
    assert t.state is TrajectoryState.truncated and t.restarts >= 1
    assert [x.index for x in t.turns] == [0, 1, 2] and {x.engine_id for x in t.turns} == {"second"}
    assert not await redis.exists(keys.traj_turns(tid))


class FirstCallWaits(SimEngine):
    """The first request waits until `release` is set (a turn stuck in the engine); later ones answer."""

    def __init__(self):
        super().__init__("stuck")
        self.release, self.calls = threading.Event(), 0

    async def generate(self, req):
        self.calls += 1
        if self.calls == 1:
            while not self.release.is_set():
                await asyncio.sleep(0.02)
        return await super().generate(req)


async def test_a_trajectory_claimed_again_by_its_own_worker_supersedes_the_old_episode(settings, redis, keys):
    """A lease can lapse while its holder still runs (Redis away past the lease, a failover that
    lost it); the requeued trajectory may come back to the same worker. The new claim must
    replace the old episode, not collide with it (once: 'already live', charged as an attempt)."""
    settings = dataclasses.replace(settings, lease_s=60.0)  # heartbeats 20 s apart: none in this test
    q, store = Queue(redis, keys, settings.lease_s, settings.max_attempts), Store(redis, keys)
    engine = FirstCallWaits()
    b = await q.enqueue(RolloutRequest(tasks=[{"seed": 1}], env="math"))
    tid = f"{b.id}-0-0"
    with RunningWorker(settings, engines={"stuck": (engine, "byte")}):
        while engine.calls == 0:  # the first episode is inside the engine
            await asyncio.sleep(0.02)
        await redis.zadd(keys.leases, {tid: 0})  # its lease lapses while it still runs
        assert await q.reap() == (1, 0)
        while engine.calls < 2:  # claimed again, by the only worker there is
            await asyncio.sleep(0.02)
        engine.release.set()
        await wait_done(store, b.id)
    t = await store.trajectory(tid)
    assert t.state is TrajectoryState.completed and t.attempts == 1 and t.restarts == 1, (t.attempts, t.failure)


async def test_a_cancelled_worker_stops_whenever_the_cancel_lands(redis, keys):
    """Cancelling `Worker.run` is its shutdown, wherever the cancel lands: inside a Redis call
    (Python 3.11's `wait_for` around redis-py's send drops it) or while the idle wait tidies up
    its helpers. Before, the worker went on claiming and heartbeating after its shutdown.
    Cancels land at every point of idle cycles made short."""
    from env_workers.client import LocalEnvs
    from rollout_service.engines.fleet import Fleet
    from rollout_service.worker import Worker

    q, fleet = Queue(redis, keys), Fleet({"sim-0": (SimEngine("sim-0", seed=1), "byte")})
    swallowed = 0
    for ticks in range(0, 300, 2):
        w, stop = Worker(q, Store(redis, keys), fleet, LocalEnvs(), idle_wait_s=0.01), asyncio.Event()
        task = asyncio.create_task(w.run(stop))
        for i in range(ticks):
            if i % 7 == 0:
                await redis.rpush(keys.wake, "x")  # some waits end woken, some by their timeout
            await asyncio.sleep(0)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=10)
        if not done:  # the cancel was swallowed: the worker is still looping
            swallowed += 1
            stop.set()
            await asyncio.wait({task}, timeout=10)
        else:
            assert task.cancelled(), task.exception()
    assert swallowed == 0


async def test_a_worker_with_no_engine_for_a_whole_turn_leaves_the_batch_queued_until_one_is(settings, redis, keys):
    """A batch submitted before any engine registered (vLLM still loading), or while the only
    engine prefills, spent each trajectory's attempts in about a second and failed them all as
    `engine` ("no engine registered"). The worker now waits to claim; the batch runs once an
    engine can serve a whole turn."""
    from scheduler.registry import Registry
    from tests.rollout_service.test_fleet import start_sim
    from wire import EngineInfo

    q, store = Queue(redis, keys), Store(redis, keys)
    b = await q.enqueue(RolloutRequest(tasks=[{"seed": i} for i in range(3)], env="math"))
    proc, url = start_sim(time_scale=0.0)
    try:
        with RunningWorker(settings, discover=True):
            await asyncio.sleep(2.5)  # longer than the three attempts' back-off took (0.5 s + 1 s)
            st = await store.batch_status(b.id)
            assert st.counts[TrajectoryState.queued] == 3 and st.finished_at is None, st.counts
            # an engine that only prefills (a role set by hand, its decode peer not registered yet):
            # no turn can run either ("no engine takes decode"), so still nothing is claimed
            reg = Registry(redis, keys)
            await reg.add_engine(EngineInfo(id="late", url=url, role="prefill"))
            await asyncio.sleep(3.5)  # the worker reads the registry every 2 s, then 1.5 s of back-off
            st = await store.batch_status(b.id)
            assert st.counts[TrajectoryState.queued] == 3 and st.finished_at is None, st.counts
            await reg.set_role("late", "mixed")
            st = await wait_done(store, b.id)
        assert st.counts[TrajectoryState.completed] == 3, st.counts
        trajs, _ = await store.trajectories(b.id, 0, 10)
        assert [t.attempts for t in trajs] == [1, 1, 1] and {t.turns[0].engine_id for t in trajs} == {"late"}
    finally:
        proc.kill()
        proc.wait()


async def test_a_batch_keeps_its_totals_as_its_trajectories_finish(settings, redis, keys):
    """`rollout submit --wait` read every trajectory of the batch (every token) to print its
    summary: a 10,000-trajectory SWE batch meant gigabytes. The finishing script now keeps the
    batch's totals, equal to what the trajectories add up to, failures and cancels included."""
    from rollout_service.cli.admin import _totals

    q, store = Queue(redis, keys), Store(redis, keys)
    tasks = [{"seed": 1}, {"seed": 2}, {"no": "question"}, {"seed": 4}]  # the third: rejected by the env
    b = await q.enqueue(RolloutRequest(tasks=tasks, env="calc", group_size=3))
    assert (await store.batch_status(b.id)).totals == _totals([])  # kept from the start: all zero
    with RunningWorker(settings):
        await wait_done(store, b.id)
    st = await store.batch_status(b.id)
    trajs, _ = await store.trajectories(b.id, 0, 100)
    assert st.totals == _totals(trajs) and st.totals.failures == {"rejected": 3}, st.totals
    assert st.totals.sampled_tokens + st.totals.prompt_tokens == sum(len(t.token_ids) for t in trajs)
    assert st.totals.turns > st.totals.turned == 9 and st.totals.rewarded == 9
    cancelled = await q.enqueue(RolloutRequest(tasks=[{"seed": 1}], env="calc", group_size=2))
    await q.cancel(cancelled.id)
    st = await store.batch_status(cancelled.id)
    assert st.totals.failures == {"cancelled": 2} and st.totals.turns == 0 and st.totals.mean_reward is None
    await redis.hdel(keys.batch(cancelled.id), "sum:turns")  # a batch queued before totals were kept
    assert (await store.batch_status(cancelled.id)).totals is None
