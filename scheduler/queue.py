"""The durable job queue: enqueue, claim, heartbeat, append_turn, complete, fail, reap, cancel.

Every state change is one Lua script, so it is atomic with the counters and the event it emits.
A worker's turns and finishes of one moment share one script call (`Coalesced`), and one
heartbeat call renews all its leases, so Redis sees a few calls a moment however many run. A
claim is a lease: a deadline in the `leases` zset plus a random token stored on the trajectory.
Only the token holder may heartbeat or finish; a lease that lapses is reaped back into the
queue (or failed once `max_attempts` is spent), so a dead worker loses nothing. Finishing is
idempotent: the first terminal result recorded wins.

While an attempt runs, the lease holder appends each finished turn but the last (`append_turn`;
the last comes with the result), so readers see a running trajectory's turns and a crash loses
at most the turn in progress. Every state
change out of `running` drops that list: a requeued trajectory reruns from its first turn
(no turn of the lost attempt mixes with the rerun's), and a terminal one has them in its result.

What is claimed next is the scheduling policy (the scripts are in `scheduler.lua`): the
tenant furthest below its weighted fair share of running trajectories, skipping tenants at
their running cap; within it the highest-priority batch, then the longest expected (with
`longest_first`, from the forecaster's per-environment history) or the oldest; within a batch
submission order, so a GRPO group's members are claimed together or one after the other; a
requeued trajectory goes first in its batch. Idle workers block on a wake list (`wait`) that
every change making work claimable pushes to, instead of polling.

Results and live turns are stored packed (`wire.packed`); a result goes to the `ResultStore`
given (inline in Redis by default). Reads (status, pages, events) live in `scheduler.store`.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
import uuid
from bisect import bisect_left
from dataclasses import dataclass

import msgpack
import redis.asyncio as aioredis

from scheduler import lua
from scheduler.connection import Coalesced, durable
from scheduler.jobs import TRANSITIONS, IllegalTransition
from scheduler.keys import Keys, batch_of
from scheduler.results import RedisResults, ResultStore, compress_result, compress_results
from wire import (
    BatchCreated,
    Failure,
    FailureKind,
    RolloutRequest,
    Trajectory,
    TrajectoryState,
    Turn,
)
from wire.packed import pack_trajectory, pack_turn

# Upper bounds (s) of the per-turn prefill histogram, counted in `{p}stats` as `prefill:{bound}`
# (and `prefill:inf`) when a trajectory completes; `rollout_service.metrics` exports it.
PREFILL_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
PREFILL_KEYS = (*(f"prefill:{b}" for b in PREFILL_BUCKETS_S), "prefill:inf")  # a turn counts in the first bound >= its time

# The states `complete` records: the terminal ones a running trajectory may reach (`scheduler.jobs`).
_FINISHED = frozenset(s for s in TRANSITIONS[TrajectoryState.running] if s.terminal)

# What `heartbeat_many` says of each lease, and how many it renews per script call.
LEASE_LOST, LEASE_OK, BATCH_CANCELLED = 0, 1, 2
HEARTBEAT_CHUNK = 1000


@dataclass(slots=True)
class Claim:
    """A leased trajectory. `token` proves ownership to every later call."""

    trajectory_id: str
    token: str
    attempt: int  # 1 + the failures charged to the trajectory so far
    restarts: int = 0  # times our infrastructure restarted it (never charged)
    # What the claim read of the trajectory along the way (`Store.work` then reads only the
    # batch's parameters, once per batch); None where a Claim was made by hand.
    batch_id: str | None = None
    group_index: int = 0
    sample_index: int = 0
    task: str | None = None  # JSON, as stored


class LeaseLost(Exception):
    """The lease expired or was taken over; the holder must stop without writing."""


def _finish_stats(traj: Trajectory) -> str:
    """What a finish adds to `{p}stats`: the tokens, the turns, and the prefill histogram (a
    bucket per turn, and the sum). Tokens and turns go to the batch's totals too."""
    sampled = prompt = prefill_us = 0
    buckets: dict[str, int] = {}
    for t in traj.turns:
        sampled += len(t.output_ids)
        prompt += len(t.prompt_ids)
        s = t.timings.prefill_s
        key = PREFILL_KEYS[bisect_left(PREFILL_BUCKETS_S, s)]
        buckets[key] = buckets.get(key, 0) + 1
        prefill_us += round(s * 1e6)
    stats = f"tokens:sampled={sampled},tokens:prompt={prompt},prefill_sum_us={prefill_us}"
    if traj.turns:  # (the batch's totals: turns, and how many trajectories took any)
        stats += f",turns={len(traj.turns)},turned=1"
    for key, n in buckets.items():
        stats += f",{key}={n}"
    return stats


class QuotaExceeded(Exception):
    """The tenant has `open` trajectories queued or running; `requested` more would pass `limit`."""

    def __init__(self, tenant: str, open: int, requested: int, limit: int):
        super().__init__(f"tenant {tenant!r} has {open} trajectories queued or running; "
                         f"{requested} more would pass its limit of {limit}")
        self.tenant, self.open, self.requested, self.limit = tenant, open, requested, limit


class IdempotencyConflict(Exception):
    """The idempotency key already names `batch_id`, which was submitted with another request."""

    def __init__(self, key: str, batch_id: str):
        super().__init__(f"idempotency key {key!r} already names batch {batch_id}, submitted with a different "
                         "request; resubmit that same request to get its batch, or use a new key")
        self.key, self.batch_id = key, batch_id


class Queue:
    def __init__(self, redis: aioredis.Redis, keys: Keys | None = None, lease_s: float = 30.0,
                 max_attempts: int = 3, max_restarts: int = 20, longest_first: bool = False,
                 replicas: int = 0, results: ResultStore | None = None):
        self.r = redis
        self.replicas = replicas  # a new batch waits for this many replicas (connection.durable)
        self.k = keys or Keys()
        self.results = results or RedisResults()  # where complete() puts the packed result
        self.lease_s = lease_s
        self.max_attempts = max_attempts  # failures the trajectory itself is charged for
        self.max_restarts = max_restarts  # restarts that were our fault: only stops poison work
        self.longest_first = longest_first
        self._enqueue = redis.register_script(lua.ENQUEUE)
        self._claim = redis.register_script(lua.CLAIM)
        self._heartbeat = redis.register_script(lua.HEARTBEAT)
        self._turns = self._coalesced(lua.TURN)
        # Results kept inline are packed and compressed as their call goes out (`_pack_finishes`).
        self._inline = isinstance(self.results, RedisResults)
        self._finishes = self._coalesced(lua.FINISH, self._pack_finishes if self._inline else None)
        self._reap = redis.register_script(lua.REAP)
        self._release = redis.register_script(lua.RELEASE)
        self._cancel = redis.register_script(lua.CANCEL)

    def _coalesced(self, source: str, prepare=None) -> Coalesced:
        """Calls of the script made in the same moment go to Redis as one call, their items as one
        msgpack argument that the script decodes (Lua's cmsgpack): redis-py encodes each argument
        in Python, ten a finish. (`bin` off: cmsgpack reads strings only.)"""
        script = self.r.register_script(source)
        return Coalesced(lambda items: script(args=[self.k.prefix, msgpack.packb(items, use_bin_type=False)]),
                         prepare=prepare)

    @staticmethod
    async def _pack_finishes(items: list[list]) -> list[Exception | None]:
        """A finishing call's inline results, packed, counted and compressed together as the call
        goes out: the worker's episodes then run back to back, and so does this (on the instant
        engine, 11% more trajectories/s than doing it in each `complete`: benchmarks/queue_overhead.py).
        A trajectory that cannot be packed fails its own `complete`, not its neighbours'."""
        errors: list[Exception | None] = [None] * len(items)
        packed: list[bytes] = []
        at: list[list] = []
        for i, item in enumerate(items):
            traj = item[3]
            if not isinstance(traj, Trajectory):  # a requeue: no result
                continue
            try:
                packed.append(pack_trajectory(traj, samples=False))
                item[9] = _finish_stats(traj)
            except Exception as e:
                errors[i] = e
                continue
            at.append(item)
        for item, stored in zip(at, await compress_results(packed)):
            item[3] = stored
        return errors

    def _deadline_ms(self, lease_s: float | None = None) -> int:
        return int((time.time() + (self.lease_s if lease_s is None else lease_s)) * 1000)

    async def enqueue(self, req: RolloutRequest, tenant: str = "default", max_open: int = 0,
                      weight: float = 1.0, max_running: int = 0) -> BatchCreated:
        """Persist a batch and queue its trajectories. Same idempotency key, same batch (even
        over the quota), if the request is the same too: a key reused for another request (a
        fixed key per training step, across runs) raises IdempotencyConflict rather than answer
        with a batch of other tasks. Raises QuotaExceeded, queueing nothing, when the tenant would have more
        than `max_open` trajectories queued or running (0: no cap); checked in the same script.
        `weight` (its fair share against other tenants) and `max_running` (most of its trajectories
        running at once, 0: none) become the tenant's policy from this submission on."""
        if not weight > 0:
            raise ValueError(f"a tenant's weight must be positive, got {weight}")
        bid = uuid.uuid4().hex[:16]
        params = req.model_dump_json(exclude={"tasks"})
        tasks = msgpack.packb(list(map(json.dumps, req.tasks)), use_bin_type=False)  # (cmsgpack reads strings only)
        # what makes a resubmission the same request (only kept, and asked, with a key)
        fingerprint = hashlib.blake2b(params.encode() + b"\0" + tasks, digest_size=16).hexdigest() \
            if req.idempotency_key else ""
        args: list[str | int | float | bytes] = [
            self.k.prefix, f"{tenant}:{req.idempotency_key}" if req.idempotency_key else "", bid, params,
            time.time(), req.num_trajectories, tenant, max_open, weight, max_running, req.priority,
            "1" if self.longest_first else "0", req.env, req.group_size, tasks, fingerprint]
        got_bid, created, *open_now = await durable(self.r, self._enqueue, args, self.replicas)
        if created == -1:
            raise QuotaExceeded(tenant, int(open_now[0]), req.num_trajectories, max_open)
        got_bid = got_bid.decode() if isinstance(got_bid, bytes) else got_bid
        if created == -2:
            raise IdempotencyConflict(req.idempotency_key or "", got_bid)
        total = req.num_trajectories if created else int(await self.r.hget(self.k.batch(got_bid), "total") or 0)
        return BatchCreated(id=got_bid, num_trajectories=total, created=bool(created))

    async def claim(self, worker_id: str) -> Claim | None:
        """Lease the next trajectory in fair-share order, or None when nothing is ready."""
        got = await self.claim_many(worker_id, 1)
        return got[0] if got else None

    async def claim_many(self, worker_id: str, n: int) -> list[Claim]:
        """Lease up to `n` trajectories in one atomic step: the tenant furthest below its fair
        share first (skipping tenants at their running cap), its best-ranked batch, and the
        rest of a GRPO group together while `n` allows. Empty when nothing is ready."""
        if n < 1:
            return []
        got = await self._claim(args=[self.k.prefix, self._deadline_ms(), secrets.token_hex(8), worker_id,
                                      time.time(), n])
        text = bytes.decode if got and isinstance(got[0], bytes) else str  # (a client that decodes replies gives str)
        it = iter(got)
        return [Claim(text(tid), text(token), int(attempt), int(restarts), text(bid), int(group), int(sample), text(task))
                for tid, attempt, restarts, token, bid, group, sample, task in zip(it, it, it, it, it, it, it, it)]

    async def wait(self, timeout_s: float) -> bool:
        """Block until work may have become ready (a submission, a requeue, a slot freed under a
        tenant's cap) or `timeout_s` passes; True when woken. A wake can be stale (another
        worker took the work): claim again to know. Holds one connection while it blocks."""
        return await self.r.blpop([self.k.wake], timeout=timeout_s) is not None

    async def report_expected(self, seconds_by_env: dict[str, float]) -> None:
        """Publish the expected duration of an episode per environment (the forecaster's
        history), which ranks batches when the queue runs longest-expected first."""
        if seconds_by_env:
            await self.r.hset(self.k.expected, mapping={e: round(s, 3) for e, s in seconds_by_env.items()})

    async def heartbeat(self, claim: Claim) -> bool:
        """Extend the lease. Returns False when the batch was cancelled; raises LeaseLost."""
        got = (await self.heartbeat_many([claim]))[0]
        if got == LEASE_LOST:
            raise LeaseLost(claim.trajectory_id)
        return got == LEASE_OK

    async def heartbeat_many(self, claims: list[Claim], lease_s: float | None = None) -> list[int]:
        """Extend many leases in one round trip: `HEARTBEAT_CHUNK` to a script call (each call is
        atomic and short, so it never holds Redis up for long), the calls pipelined (so a busy
        event loop costs one wait, not one per chunk), each by `lease_s` (default: the queue's).
        Per claim LEASE_OK, LEASE_LOST or BATCH_CANCELLED."""
        if not claims:
            return []
        pipe = self.r.pipeline(transaction=False)
        for i in range(0, len(claims), HEARTBEAT_CHUNK):
            args: list[str | int] = [self.k.prefix, self._deadline_ms(lease_s)]
            for c in claims[i:i + HEARTBEAT_CHUNK]:
                args += [c.trajectory_id, c.token]
            await self._heartbeat(args=args, client=pipe)
        return [int(x) for got in await pipe.execute() for x in got]

    async def append_turn(self, claim: Claim, turn: Turn) -> None:
        """Record a finished turn of the running attempt (durable from here). Raises LeaseLost
        when `claim` no longer holds the lease: a writer without it never appends."""
        got = await self._turns.submit([claim.trajectory_id, claim.token, turn.index, pack_turn(turn)])
        if got == 0:
            raise LeaseLost(claim.trajectory_id)
        if got < 0:
            raise IllegalTransition(f"turn {turn.index} of {claim.trajectory_id} recorded before the turns ahead of it")

    async def complete(self, claim: Claim, traj: Trajectory) -> bool:
        """Record a terminal trajectory. False if someone else finished it first."""
        if traj.state not in _FINISHED:  # running -> queued is retry(), not complete()
            raise IllegalTransition(f"complete() needs a terminal state, got {traj.state.value}")
        failure = traj.failure.model_dump_json() if traj.failure else ""
        reward = "" if traj.reward is None else repr(traj.reward)
        # (the state as itself: a str enum, which msgpack writes as its value)
        if self._inline:  # the result goes in the script's call: packed as the call goes out
            return bool(await self._finishes.submit([claim.trajectory_id, claim.token, traj.state, traj, reward,
                                                     failure, time.time(), 0, "", ""]))
        # The result is kept first and recorded by the script: a reader never sees a terminal
        # state without its result. A lost race leaves a blob nobody recorded: drop it.
        stored = await compress_result(pack_trajectory(traj, samples=False))
        recorded = await self.results.put(claim.batch_id or batch_of(claim.trajectory_id), claim.trajectory_id, claim.token,
                                          stored)
        got = await self._finishes.submit([claim.trajectory_id, claim.token, traj.state, recorded, reward,
                                           failure, time.time(), 0, "", _finish_stats(traj)])
        if not got:
            await self.results.discard(recorded)
        return bool(got)

    async def retry(self, claim: Claim, delay_s: float = 0.0) -> bool:
        """Give the trajectory back to the queue after a retryable failure, charging one of its
        attempts; claimable again after `delay_s` so a restarting engine or env worker is not hammered."""
        return await self._requeue(claim, delay_s, "attempts")

    async def restart(self, claim: Claim, delay_s: float = 0.0) -> bool:
        """Give the trajectory back because our infrastructure lost its episode (an engine or
        env worker died, Redis went away): counted as a restart, its attempts untouched."""
        return await self._requeue(claim, delay_s, "restarts")

    async def _requeue(self, claim: Claim, delay_s: float, charge: str) -> bool:
        ready_ms = int((time.time() + delay_s) * 1000) if delay_s > 0 else 0
        got = await self._finishes.submit([claim.trajectory_id, claim.token, "queued", "", "", "", time.time(),
                                           ready_ms, charge, ""])
        return bool(got)

    def _poison(self) -> str:
        return Failure(kind=FailureKind.internal,
                       message=f"restarted {self.max_restarts} times: its worker kept dying or stalling "
                               "(does this task crash workers?)").model_dump_json()

    async def reap(self) -> tuple[int, int]:
        """Queue retries whose back-off is over; requeue trajectories whose lease lapsed (a
        restart, not an attempt) and fail those restarted `max_restarts` times (poison work)."""
        requeued, failed = await self._reap(args=[self.k.prefix, int(time.time() * 1000), self.max_restarts,
                                                  time.time(), self._poison()])
        return int(requeued), int(failed)

    async def release(self, worker_id: str) -> tuple[int, int]:
        """Requeue (as restarts) what a dead worker of this id still holds; call it when a
        worker starts under a stable id, before it claims. Ids must be unique among live workers."""
        requeued, failed = await self._release(args=[self.k.prefix, worker_id, self.max_restarts, time.time(),
                                                     self._poison()])
        return int(requeued), int(failed)

    async def cancel(self, batch_id: str) -> bool | None:
        """Cancel a batch. None if unknown, False if already finished, True if cancelled now."""
        failure = Failure(kind=FailureKind.cancelled, message="batch cancelled").model_dump_json()
        got = await self._cancel(args=[self.k.prefix, batch_id, time.time(), failure])
        return None if got == -1 else got > 0

    async def depth(self) -> int:
        """Trajectories queued: ready to claim or backing off before a retry."""
        return int(await self.r.get(self.k.queued) or 0)

    async def running(self) -> int:
        return int(await self.r.zcard(self.k.leases))

