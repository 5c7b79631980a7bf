"""Finished batches expire: `Retention.sweep` deletes every batch that finished more than
`retention_s` ago, its results (in the `ResultStore`) first, then all its Redis keys at once.

A batch is finished when its state is terminal and `finished_at` is set (every trajectory
reached a terminal state). Running or queued batches are never touched, however old. The
sweep is idempotent and safe to run from several processes: the deleting script re-checks the
batch, so two sweepers delete it once and a reader sees either the whole batch or none of it
(a blob store's files go first: a reader in between finds the trajectory without its result,
reported as gone).

Non-goals: expiring anything else (engines, workers, sessions, counters), and archiving.
"""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from scheduler.keys import Keys
from scheduler.results import ResultStore

_PURGE = """
-- ARGV: prefix, bid, cutoff (s).  Returns 1 when the batch was deleted, 0 when it is not (yet) expired.
local p, bid = ARGV[1], ARGV[2]
local bkey = p .. 'batch:' .. bid
local state = redis.call('HGET', bkey, 'state')
local finished = tonumber(redis.call('HGET', bkey, 'finished_at') or '')
if (state ~= 'completed' and state ~= 'cancelled') or not finished or finished > tonumber(ARGV[3]) then
  return 0
end
for _, tid in ipairs(redis.call('LRANGE', bkey .. ':trajs', 0, -1)) do
  redis.call('DEL', p .. 'traj:' .. tid, p .. 'traj:' .. tid .. ':turns')
end
local tenant = redis.call('HGET', bkey, 'tenant') or 'default'
local key = cjson.decode(redis.call('HGET', bkey, 'params') or '{}')['idempotency_key']
if type(key) == 'string' then  -- the key is the tenant's (see Queue.enqueue): only if it still names this batch
  local ikey = p .. 'idem:' .. tenant .. ':' .. key
  if redis.call('GET', ikey) == bid then redis.call('DEL', ikey) end
end
redis.call('DEL', bkey, bkey .. ':trajs', bkey .. ':events')
redis.call('ZREM', p .. 'batches', bid)
redis.call('ZREM', p .. 'tenant:' .. tenant .. ':batches', bid)
return 1
"""


class Retention:
    def __init__(self, redis: aioredis.Redis, keys: Keys, results: ResultStore, retention_s: float,
                 scan: int = 500):
        self.r, self.k, self.results = redis, keys, results
        self.retention_s = retention_s  # 0: keep forever
        self.scan = scan  # batches looked at per sweep (bounded work per call)
        self._offset = 0  # where the next sweep looks, among batches old enough to have expired
        self._purge = redis.register_script(_PURGE)

    async def sweep(self, now: float | None = None) -> list[str]:
        """Delete the expired batches among the next `scan` candidates; returns their ids."""
        if self.retention_s <= 0:
            return []
        cutoff = (time.time() if now is None else now) - self.retention_s
        # A batch cannot have finished before it was created: only those created before the
        # cutoff are candidates, oldest first; a window of unfinished ones is stepped over.
        bids = [b.decode() if isinstance(b, bytes) else b for b in await self.r.zrangebyscore(
            self.k.batches, "-inf", cutoff, start=self._offset, num=self.scan)]
        pipe = self.r.pipeline(transaction=False)
        for bid in bids:
            pipe.hmget(self.k.batch(bid), "state", "finished_at")
        gone: list[str] = []
        for bid, (state, finished) in zip(bids, await pipe.execute()):
            if state in (b"completed", b"cancelled") and finished and float(finished) <= cutoff:
                await self.results.drop_batch(bid)
                if await self._purge(args=[self.k.prefix, bid, cutoff]):
                    gone.append(bid)
        kept = len(bids) - len(gone)
        self._offset = self._offset + kept if len(bids) == self.scan else 0
        return gone
