"""The durable job queue: enqueue, claim, heartbeat, append_turn, complete, fail, reap, cancel.

Every state change is one Lua script, so it is atomic with the counters and the event it
emits. A claim is a lease: a deadline in the `leases` zset plus a random token stored on the
trajectory. Only the token holder may heartbeat or finish; a lease that lapses is reaped
back into the queue (or failed once `max_attempts` is spent), so a dead worker loses
nothing. Finishing is idempotent: the first terminal result recorded wins.

While an attempt runs, the lease holder appends each finished turn (`append_turn`), so readers
see a running trajectory's turns and a crash loses at most the turn in progress. Every state
change out of `running` drops that list: a requeued trajectory reruns from its first turn
(no turn of the lost attempt mixes with the rerun's), and a terminal one has them in its result.

Results and live turns are stored packed (`wire.packed`); a result goes to the `ResultStore`
given (inline in Redis by default). Reads (status, pages, events) live in `scheduler.store`.
"""

from __future__ import annotations

import json
import secrets
import time
import uuid
from dataclasses import dataclass

import redis.asyncio as aioredis

from scheduler.jobs import IllegalTransition, check_transition
from scheduler.keys import Keys, batch_of, trajectory_id
from scheduler.results import RedisResults, ResultStore, compress
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

# Shared Lua: move trajectory `tid` (hash `tkey`) of batch hash `bkey` to a new state,
# keeping per-state counters, the lease zset, the queue and the event stream consistent.
_FINISH_FN = """
local function finish(p, tid, new_state, result, reward, failure, now, ready_ms)
  local tkey = p .. 'traj:' .. tid
  local old = redis.call('HGET', tkey, 'state')
  if old == false or (old ~= 'queued' and old ~= 'running') then return 0 end
  local bid = redis.call('HGET', tkey, 'batch')
  local bkey = p .. 'batch:' .. bid
  redis.call('ZREM', p .. 'leases', tid)
  redis.call('DEL', tkey .. ':turns')  -- the attempt's live turns: rerun from the start, or kept in the result
  redis.call('HINCRBY', bkey, 'n:' .. old, -1)
  redis.call('HINCRBY', bkey, 'n:' .. new_state, 1)
  if new_state == 'queued' then
    redis.call('HSET', tkey, 'state', 'queued', 'token', '')
    if ready_ms and tonumber(ready_ms) > 0 then
      redis.call('ZADD', p .. 'delayed', ready_ms, tid)  -- back-off: the reaper queues it when due
    else
      redis.call('RPUSH', p .. 'queue', tid)
    end
    return 1
  end
  redis.call('ZREM', p .. 'delayed', tid)
  local tenant = redis.call('HGET', bkey, 'tenant')
  if tenant and redis.call('DECR', p .. 'tenant:' .. tenant .. ':open') <= 0 then
    redis.call('DEL', p .. 'tenant:' .. tenant .. ':open')  -- never below 0 (batches queued before the quota)
  end
  redis.call('HSET', tkey, 'state', new_state, 'token', '', 'finished_at', now)
  if result ~= '' then redis.call('HSET', tkey, 'result', result) end
  if reward ~= '' then redis.call('HSET', tkey, 'reward', reward) end
  if failure ~= '' then redis.call('HSET', tkey, 'failure', failure) end
  redis.call('HINCRBY', p .. 'stats', 'finished:' .. new_state, 1)
  if failure ~= '' then redis.call('HINCRBY', p .. 'stats', 'failure:' .. cjson.decode(failure)['kind'], 1) end
  local done = redis.call('HINCRBY', bkey, 'n_done', 1)
  redis.call('XADD', p .. 'batch:' .. bid .. ':events', '*', 'tid', tid, 'state', new_state,
             'reward', reward, 'failure', failure)
  if done >= tonumber(redis.call('HGET', bkey, 'total')) then
    if redis.call('HGET', bkey, 'state') ~= 'cancelled' then redis.call('HSET', bkey, 'state', 'completed') end
    redis.call('HSET', bkey, 'finished_at', now)
    redis.call('XADD', p .. 'batch:' .. bid .. ':events', '*', 'tid', '', 'state', 'batch_done',
               'reward', '', 'failure', '')
  end
  return 1
end
"""

_ENQUEUE = """
-- ARGV: prefix, idem_key ('' for none), bid, params json, now, total, tenant, max open (0: no cap),
-- then tid, group, sample, task...  Returns {bid, 1} created, {bid, 0} existing, {'', -1, open} over quota
local p = ARGV[1]
if ARGV[2] ~= '' then
  local existing = redis.call('GET', p .. 'idem:' .. ARGV[2])
  if existing then return {existing, 0} end  -- before the quota: a resubmission always gets its batch
end
local okey = p .. 'tenant:' .. ARGV[7] .. ':open'
local open = tonumber(redis.call('GET', okey) or '0')
if tonumber(ARGV[8]) > 0 and open + tonumber(ARGV[6]) > tonumber(ARGV[8]) then return {'', -1, open} end
redis.call('INCRBY', okey, ARGV[6])  -- finish() takes each one off as it reaches a terminal state
if ARGV[2] ~= '' then redis.call('SET', p .. 'idem:' .. ARGV[2], ARGV[3]) end
local bid = ARGV[3]
local bkey = p .. 'batch:' .. bid
redis.call('HSET', bkey, 'state', 'queued', 'params', ARGV[4], 'created_at', ARGV[5], 'total', ARGV[6],
           'n_done', 0, 'n:queued', ARGV[6], 'tenant', ARGV[7])
redis.call('ZADD', p .. 'batches', ARGV[5], bid)
redis.call('ZADD', p .. 'tenant:' .. ARGV[7] .. ':batches', ARGV[5], bid)
for i = 9, #ARGV, 4 do
  local tid = ARGV[i]
  redis.call('HSET', p .. 'traj:' .. tid, 'state', 'queued', 'batch', bid, 'group', ARGV[i + 1],
             'sample', ARGV[i + 2], 'task', ARGV[i + 3], 'attempts', 0)
  redis.call('RPUSH', bkey .. ':trajs', tid)
  redis.call('RPUSH', p .. 'queue', tid)
end
return {bid, 1}
"""

_CLAIM = """
-- ARGV: prefix, lease deadline ms, token, worker, now
local p = ARGV[1]
for _ = 1, 1000 do
  local tid = redis.call('LPOP', p .. 'queue')
  if not tid then return false end
  local tkey = p .. 'traj:' .. tid
  if redis.call('HGET', tkey, 'state') == 'queued' then
    local bkey = p .. 'batch:' .. redis.call('HGET', tkey, 'batch')
    redis.call('HSET', tkey, 'state', 'running', 'token', ARGV[3], 'worker', ARGV[4], 'started_at', ARGV[5])
    local attempt = tonumber(redis.call('HGET', tkey, 'attempts') or '0') + 1
    local restarts = tonumber(redis.call('HGET', tkey, 'restarts') or '0')
    redis.call('ZADD', p .. 'leases', ARGV[2], tid)
    redis.call('HINCRBY', bkey, 'n:queued', -1)
    redis.call('HINCRBY', bkey, 'n:running', 1)
    if redis.call('HGET', bkey, 'state') == 'queued' then redis.call('HSET', bkey, 'state', 'running') end
    return {tid, attempt, restarts}
  end
  -- anything else is a stale entry (cancelled while queued): drop it and look further
end
return false
"""

_HEARTBEAT = """
-- ARGV: prefix, tid, token, deadline ms.  Returns 0 lease lost, 1 ok, 2 batch cancelled
local p = ARGV[1]
local tkey = p .. 'traj:' .. ARGV[2]
if redis.call('HGET', tkey, 'token') ~= ARGV[3] or redis.call('HGET', tkey, 'state') ~= 'running' then return 0 end
redis.call('ZADD', p .. 'leases', 'XX', ARGV[4], ARGV[2])
if redis.call('HGET', p .. 'batch:' .. redis.call('HGET', tkey, 'batch'), 'state') == 'cancelled' then return 2 end
return 1
"""

_TURN = """
-- ARGV: prefix, tid, token, turn index, turn json.  Returns 0 lease lost, 1 recorded, -1 out of order
local tkey = ARGV[1] .. 'traj:' .. ARGV[2]
if redis.call('HGET', tkey, 'token') ~= ARGV[3] or redis.call('HGET', tkey, 'state') ~= 'running' then return 0 end
local lkey = tkey .. ':turns'
local n, i = redis.call('LLEN', lkey), tonumber(ARGV[4])
if i == n then
  redis.call('RPUSH', lkey, ARGV[5])
elseif i < n then
  redis.call('LSET', lkey, i, ARGV[5])  -- the same turn again (a write retried after a timeout)
else
  return -1
end
return 1
"""

_FINISH = _FINISH_FN + """
-- ARGV: prefix, tid, token, new_state, result, reward, failure, now, ready ms (retry back-off),
-- counter to charge on a requeue ('attempts': the trajectory's retry budget; 'restarts': our fault)
local tkey = ARGV[1] .. 'traj:' .. ARGV[2]
if redis.call('HGET', tkey, 'token') ~= ARGV[3] then return 0 end
local ok = finish(ARGV[1], ARGV[2], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9])
if ok == 1 and ARGV[10] and ARGV[10] ~= '' then
  redis.call('HINCRBY', tkey, ARGV[10], 1)
  redis.call('HINCRBY', ARGV[1] .. 'stats', ARGV[10], 1)
end
return ok
"""

# A lease that lapsed (or whose holder is known dead) is our fault: a worker died, stalled,
# or lost Redis. It counts as a restart, never against the trajectory's attempts; only a
# poison task, one that keeps taking its workers down, runs out of restarts and fails.
# Returns {requeued, failed} for one trajectory.
_LAPSE_FN = _FINISH_FN + """
local function lapse(p, tid, max_restarts, now, failure)
  local tkey = p .. 'traj:' .. tid
  local restarts = tonumber(redis.call('HGET', tkey, 'restarts') or '0')
  if restarts >= tonumber(max_restarts) then
    return {0, finish(p, tid, 'failed', '', '', failure, now, 0)}
  end
  if finish(p, tid, 'queued', '', '', '', now, 0) == 1 then
    redis.call('HINCRBY', tkey, 'restarts', 1)
    redis.call('HINCRBY', p .. 'stats', 'restarts', 1)
    return {1, 0}
  end
  return {0, 0}
end
"""

_REAP = _LAPSE_FN + """
-- ARGV: prefix, now ms, max restarts, now s, failure json.  Returns {requeued, failed}
local p = ARGV[1]
for _, tid in ipairs(redis.call('ZRANGEBYSCORE', p .. 'delayed', '-inf', ARGV[2], 'LIMIT', 0, 500)) do
  redis.call('ZREM', p .. 'delayed', tid)
  redis.call('RPUSH', p .. 'queue', tid)
end
local expired = redis.call('ZRANGEBYSCORE', p .. 'leases', '-inf', ARGV[2], 'LIMIT', 0, 500)
local requeued, failed = 0, 0
for _, tid in ipairs(expired) do
  local got = lapse(p, tid, ARGV[3], ARGV[4], ARGV[5])
  requeued, failed = requeued + got[1], failed + got[2]
  redis.call('ZREM', p .. 'leases', tid)
end
return {requeued, failed}
"""

_RELEASE = _LAPSE_FN + """
-- ARGV: prefix, worker id, max restarts, now s, failure json.  Returns {requeued, failed}
-- A worker starting under the id of a dead predecessor gives back what that one held, at
-- once instead of a lease later.
local p = ARGV[1]
local requeued, failed = 0, 0
for _, tid in ipairs(redis.call('ZRANGE', p .. 'leases', 0, 9999)) do
  local tkey = p .. 'traj:' .. tid
  if redis.call('HGET', tkey, 'worker') == ARGV[2] and redis.call('HGET', tkey, 'state') == 'running' then
    local got = lapse(p, tid, ARGV[3], ARGV[4], ARGV[5])
    requeued, failed = requeued + got[1], failed + got[2]
  end
end
return {requeued, failed}
"""

_CANCEL = _FINISH_FN + """
-- ARGV: prefix, bid, now, failure json.  Cancels queued trajectories now; running ones are
-- told through their heartbeat and finish as cancelled themselves.
local p = ARGV[1]
local bkey = p .. 'batch:' .. ARGV[2]
local state = redis.call('HGET', bkey, 'state')
if state == false then return -1 end
if state == 'completed' or state == 'cancelled' then return 0 end
redis.call('HSET', bkey, 'state', 'cancelled')
local n = 0
for _, tid in ipairs(redis.call('LRANGE', bkey .. ':trajs', 0, -1)) do
  if redis.call('HGET', p .. 'traj:' .. tid, 'state') == 'queued' then
    n = n + finish(p, tid, 'cancelled', '', '', ARGV[4], ARGV[3], 0)
  end
end
return n + 1
"""


# Upper bounds (s) of the per-turn prefill histogram, counted in `{p}stats` as `prefill:{bound}`
# (and `prefill:inf`) when a trajectory completes; `rollout_service.metrics` exports it.
PREFILL_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(slots=True)
class Claim:
    """A leased trajectory. `token` proves ownership to every later call."""

    trajectory_id: str
    token: str
    attempt: int  # 1 + the failures charged to the trajectory so far
    restarts: int = 0  # times our infrastructure restarted it (never charged)


class LeaseLost(Exception):
    """The lease expired or was taken over; the holder must stop without writing."""


class QuotaExceeded(Exception):
    """The tenant has `open` trajectories queued or running; `requested` more would pass `limit`."""

    def __init__(self, tenant: str, open: int, requested: int, limit: int):
        super().__init__(f"tenant {tenant!r} has {open} trajectories queued or running; "
                         f"{requested} more would pass its limit of {limit}")
        self.tenant, self.open, self.requested, self.limit = tenant, open, requested, limit


class Queue:
    def __init__(self, redis: aioredis.Redis, keys: Keys | None = None, lease_s: float = 30.0,
                 max_attempts: int = 3, max_restarts: int = 20, results: ResultStore | None = None):
        self.r = redis
        self.k = keys or Keys()
        self.results = results or RedisResults()  # where complete() puts the packed result
        self.lease_s = lease_s
        self.max_attempts = max_attempts  # failures the trajectory itself is charged for
        self.max_restarts = max_restarts  # restarts that were our fault: only stops poison work
        self._enqueue = redis.register_script(_ENQUEUE)
        self._claim = redis.register_script(_CLAIM)
        self._heartbeat = redis.register_script(_HEARTBEAT)
        self._turn = redis.register_script(_TURN)
        self._finish = redis.register_script(_FINISH)
        self._reap = redis.register_script(_REAP)
        self._release = redis.register_script(_RELEASE)
        self._cancel = redis.register_script(_CANCEL)

    def _deadline_ms(self) -> int:
        return int((time.time() + self.lease_s) * 1000)

    async def enqueue(self, req: RolloutRequest, tenant: str = "default", max_open: int = 0) -> BatchCreated:
        """Persist a batch and queue its trajectories. Same idempotency key, same batch (even
        over the quota). Raises QuotaExceeded, queueing nothing, when the tenant would have more
        than `max_open` trajectories queued or running (0: no cap); checked in the same script."""
        bid = uuid.uuid4().hex[:16]
        params = req.model_dump_json(exclude={"tasks"})
        args: list[str | int | float] = [self.k.prefix, f"{tenant}:{req.idempotency_key}" if req.idempotency_key else "",
                                         bid, params, time.time(), req.num_trajectories, tenant, max_open]
        for g, task in enumerate(req.tasks):
            task_json = json.dumps(task)
            for s in range(req.group_size):
                args += [trajectory_id(bid, g, s), g, s, task_json]
        got_bid, created, *open_now = await self._enqueue(args=args)
        if created < 0:
            raise QuotaExceeded(tenant, int(open_now[0]), req.num_trajectories, max_open)
        got_bid = got_bid.decode() if isinstance(got_bid, bytes) else got_bid
        total = req.num_trajectories if created else int(await self.r.hget(self.k.batch(got_bid), "total") or 0)
        return BatchCreated(id=got_bid, num_trajectories=total, created=bool(created))

    async def claim(self, worker_id: str) -> Claim | None:
        token = secrets.token_hex(8)
        got = await self._claim(args=[self.k.prefix, self._deadline_ms(), token, worker_id, time.time()])
        if not got:
            return None
        tid, attempt, restarts = got
        return Claim(tid.decode() if isinstance(tid, bytes) else tid, token, int(attempt), int(restarts))

    async def heartbeat(self, claim: Claim) -> bool:
        """Extend the lease. Returns False when the batch was cancelled; raises LeaseLost."""
        got = await self._heartbeat(args=[self.k.prefix, claim.trajectory_id, claim.token, self._deadline_ms()])
        if got == 0:
            raise LeaseLost(claim.trajectory_id)
        return got == 1

    async def append_turn(self, claim: Claim, turn: Turn) -> None:
        """Record a finished turn of the running attempt (durable from here). Raises LeaseLost
        when `claim` no longer holds the lease: a writer without it never appends."""
        got = await self._turn(args=[self.k.prefix, claim.trajectory_id, claim.token, turn.index,
                                     pack_turn(turn)])
        if got == 0:
            raise LeaseLost(claim.trajectory_id)
        if got < 0:
            raise IllegalTransition(f"turn {turn.index} of {claim.trajectory_id} recorded before the turns ahead of it")

    async def complete(self, claim: Claim, traj: Trajectory) -> bool:
        """Record a terminal trajectory. False if someone else finished it first."""
        if not traj.state.terminal:  # running -> queued is retry(), not complete()
            raise IllegalTransition(f"complete() needs a terminal state, got {traj.state.value}")
        check_transition(TrajectoryState.running, traj.state)
        failure = traj.failure.model_dump_json() if traj.failure else ""
        reward = "" if traj.reward is None else repr(traj.reward)
        # The result is kept first and recorded by the script: a reader never sees a terminal
        # state without its result. A lost race leaves a blob nobody recorded: drop it.
        recorded = await self.results.put(batch_of(claim.trajectory_id), claim.trajectory_id, claim.token, compress(
            pack_trajectory(traj.model_copy(update={"training_samples": None}))))
        got = await self._finish(args=[self.k.prefix, claim.trajectory_id, claim.token, traj.state.value,
                                       recorded, reward, failure, time.time(), 0, ""])
        if not got:
            await self.results.discard(recorded)
        else:
            pipe = self.r.pipeline(transaction=False)
            pipe.hincrby(self.k.stats, "tokens:sampled", sum(len(t.output_ids) for t in traj.turns))
            pipe.hincrby(self.k.stats, "tokens:prompt", sum(len(t.prompt_ids) for t in traj.turns))
            for t in traj.turns:  # the prefill histogram: one bucket per turn, and the sum
                s = t.timings.prefill_s
                pipe.hincrby(self.k.stats, f"prefill:{next((b for b in PREFILL_BUCKETS_S if s <= b), 'inf')}", 1)
                pipe.hincrby(self.k.stats, "prefill_sum_us", round(s * 1e6))
            await pipe.execute()
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
        got = await self._finish(args=[self.k.prefix, claim.trajectory_id, claim.token, "queued", "", "", "",
                                       time.time(), ready_ms, charge])
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
        return int(await self.r.llen(self.k.queue))

    async def running(self) -> int:
        return int(await self.r.zcard(self.k.leases))

