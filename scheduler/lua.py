"""The queue's Lua scripts: every state change of a trajectory, each one atomic in Redis.

`scheduler.queue.Queue` registers and calls them; the key names they build from the prefix are
the ones `scheduler.keys` documents (a script may only touch keys it can name).

How ready work is kept, so that one claim can be fair across tenants and keep groups together:

    {p}tenants              zset  tenant -> running / weight, only tenants with ready work
    {p}tenant:{t}:ready     zset  the tenant's batches with ready work -> rank (priority, then
                                  longest expected first or submission order)
    {p}batch:{bid}:ready    list  the batch's ready trajectory ids, a GRPO group's members adjacent
    {p}tenant:{t}:share     hash  weight, cap (most running at once, 0: none), running
    {p}wake                 list  a token per trajectory made ready or slot freed under a cap
                                  (at most WAKE_CAP): idle workers BLPOP it

A claim takes the tenant with the lowest running/weight that is under its cap, that tenant's
best-ranked batch, and the head of that batch's list; while the worker wants more and the next
id belongs to the same group it keeps taking (a group's members run together), then picks the
tenant again. An id whose trajectory is no longer `queued` (its batch was cancelled) is stale:
dropped on the way.

Non-goals: reads (`scheduler.store`), the Python-side argument checks (`scheduler.queue`).
"""

from __future__ import annotations

# Most wake tokens kept: enough to wake every idle worker of a large fleet at once; more would
# only make idle workers spin through stale tokens after a busy spell.
WAKE_CAP = 256

# Rank of a batch within its tenant (lower claims first): priority dominates (1e10 s per step,
# more than any timestamp or expected duration), then, with longest-first, the expected seconds
# (1e9 minus it, so longer is lower), else the submission time.
_RANK_FN = """
local function rank(p, priority, created, longest_first, env)
  local base = tonumber(created)
  if longest_first == '1' then
    local expected = tonumber(redis.call('HGET', p .. 'expected', env) or '0')
    base = 1e9 - math.min(expected, 1e8) + (base % 1000) / 1000  -- ties: roughly submission order
  end
  return -tonumber(priority) * 1e10 + base
end
"""

_SHARE_FN = """
local WAKE_CAP = %d
local function share_key(p, tenant) return p .. 'tenant:' .. tenant .. ':share' end

-- A tenant's place in the fair-share order, kept only while it has ready work.
local function rescore(p, tenant)
  if redis.call('ZCARD', p .. 'tenant:' .. tenant .. ':ready') == 0 then
    redis.call('ZREM', p .. 'tenants', tenant)
    return 0
  end
  local sk = share_key(p, tenant)
  local running = tonumber(redis.call('HGET', sk, 'running') or '0')
  local weight = tonumber(redis.call('HGET', sk, 'weight') or '1')
  redis.call('ZADD', p .. 'tenants', running / weight, tenant)
  return 1
end

local function wake(p, n)
  for _ = 1, math.min(n, WAKE_CAP) do redis.call('LPUSH', p .. 'wake', '1') end
  redis.call('LTRIM', p .. 'wake', 0, WAKE_CAP - 1)
end

-- Put a queued trajectory back at the head of its batch's list (its group is waiting on it).
local function make_ready(p, tid, bid)
  local bkey = p .. 'batch:' .. bid
  local tenant = redis.call('HGET', bkey, 'tenant') or 'default'
  redis.call('LPUSH', bkey .. ':ready', tid)
  redis.call('ZADD', p .. 'tenant:' .. tenant .. ':ready', redis.call('HGET', bkey, 'rank') or 0, bid)
  rescore(p, tenant)
  wake(p, 1)
end
""" % WAKE_CAP

# Move trajectory `tid` to a new state, keeping per-state counters, the tenant's counts, the
# lease zset, the ready lists and the event stream consistent.
FINISH_FN = _SHARE_FN + """
local function finish(p, tid, new_state, result, reward, failure, now, ready_ms)
  local tkey = p .. 'traj:' .. tid
  local old = redis.call('HGET', tkey, 'state')
  if old == false or (old ~= 'queued' and old ~= 'running') then return 0 end
  local bid = redis.call('HGET', tkey, 'batch')
  local bkey = p .. 'batch:' .. bid
  local tenant = redis.call('HGET', bkey, 'tenant')
  redis.call('ZREM', p .. 'leases', tid)
  redis.call('DEL', tkey .. ':turns')  -- the attempt's live turns: rerun from the start, or kept in the result
  redis.call('HINCRBY', bkey, 'n:' .. old, -1)
  redis.call('HINCRBY', bkey, 'n:' .. new_state, 1)
  if old == 'running' then
    local sk = share_key(p, tenant or 'default')
    local running = redis.call('HINCRBY', sk, 'running', -1)
    if running < 0 then redis.call('HSET', sk, 'running', 0) end
    local cap = tonumber(redis.call('HGET', sk, 'cap') or '0')
    -- Below its cap again with work waiting: an idle worker may claim it now. (Under no cap,
    -- a worker is idle only when nothing is ready, so there is no one to tell.)
    if rescore(p, tenant or 'default') == 1 and cap > 0 and running == cap - 1 then wake(p, 1) end
  elseif redis.call('DECR', p .. 'queued') < 0 then
    redis.call('SET', p .. 'queued', 0)
  end
  if new_state == 'queued' then
    redis.call('HSET', tkey, 'state', 'queued', 'token', '')
    redis.call('INCR', p .. 'queued')
    if ready_ms and tonumber(ready_ms) > 0 then
      redis.call('ZADD', p .. 'delayed', ready_ms, tid)  -- back-off: the reaper makes it ready when due
    else
      make_ready(p, tid, bid)
    end
    return 1
  end
  redis.call('ZREM', p .. 'delayed', tid)
  if tenant and redis.call('DECR', p .. 'tenant:' .. tenant .. ':open') <= 0 then
    redis.call('DEL', p .. 'tenant:' .. tenant .. ':open')  -- never below 0 (batches queued before the quota)
  end
  redis.call('HSET', tkey, 'state', new_state, 'token', '', 'finished_at', now)
  if result ~= '' then redis.call('HSET', tkey, 'result', result) end
  if reward ~= '' then redis.call('HSET', tkey, 'reward', reward) end
  if failure ~= '' then redis.call('HSET', tkey, 'failure', failure) end
  redis.call('HINCRBY', p .. 'stats', 'finished:' .. new_state, 1)
  if failure ~= '' then
    local kind = cjson.decode(failure)['kind']
    redis.call('HINCRBY', p .. 'stats', 'failure:' .. kind, 1)
    redis.call('HINCRBY', bkey, 'failure:' .. kind, 1)  -- the batch's own totals (`Store.batch_status`)
  end
  local r = tonumber(reward)
  if r and r == r and r ~= 1/0 and r ~= -1/0 then  -- (a NaN would fail HINCRBYFLOAT, and the script with it)
    redis.call('HINCRBYFLOAT', bkey, 'sum:reward', reward)
    redis.call('HINCRBY', bkey, 'sum:rewarded', 1)
  end
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

ENQUEUE = _SHARE_FN + _RANK_FN + """
-- ARGV: prefix, idem_key ('' for none), bid, params json, now, total, tenant, max open (0: no cap),
-- weight, max running (0: no cap), priority, longest first ('1'/'0'), env, group size,
-- then the groups' tasks as one msgpack array of JSON strings (one argument: redis-py encodes
-- each argument in Python, ~1 µs apiece, 10,000 for a batch of 10,000 groups), then the request's
-- fingerprint ('' without a key).
-- Returns {bid, 1} created, {bid, 0} existing, {'', -1, open} over quota, {bid, -2} the key names a
-- batch of another request (one enqueued before fingerprints has none: taken as the same).
-- A trajectory's id is `{bid}-{group}-{sample}`, groups and samples from 0 (scheduler.keys.trajectory_id).
local p = ARGV[1]
if ARGV[2] ~= '' then
  local existing = redis.call('GET', p .. 'idem:' .. ARGV[2])
  if existing then  -- before the quota: a resubmission always gets its batch
    local fp = redis.call('HGET', p .. 'batch:' .. existing, 'fingerprint')
    if fp and fp ~= ARGV[16] then return {existing, -2} end
    return {existing, 0}
  end
end
local tenant = ARGV[7]
local okey = p .. 'tenant:' .. tenant .. ':open'
local open = tonumber(redis.call('GET', okey) or '0')
if tonumber(ARGV[8]) > 0 and open + tonumber(ARGV[6]) > tonumber(ARGV[8]) then return {'', -1, open} end
redis.call('INCRBY', okey, ARGV[6])  -- finish() takes each one off as it reaches a terminal state
if ARGV[2] ~= '' then redis.call('SET', p .. 'idem:' .. ARGV[2], ARGV[3]) end
local bid = ARGV[3]
local bkey = p .. 'batch:' .. bid
local r = rank(p, ARGV[11], ARGV[5], ARGV[12], ARGV[13])
redis.call('HSET', bkey, 'state', 'queued', 'params', ARGV[4], 'created_at', ARGV[5], 'total', ARGV[6],
           'n_done', 0, 'n:queued', ARGV[6], 'tenant', tenant, 'rank', r, 'sum:turns', 0)  -- (totals kept)
if ARGV[16] ~= '' then redis.call('HSET', bkey, 'fingerprint', ARGV[16]) end
redis.call('ZADD', p .. 'batches', ARGV[5], bid)
redis.call('ZADD', p .. 'tenant:' .. tenant .. ':batches', ARGV[5], bid)
redis.call('HSET', share_key(p, tenant), 'weight', ARGV[9], 'cap', ARGV[10])  -- the gateway's current policy
local size = tonumber(ARGV[14])
local ids = {}
local function push()  -- the ids in order, a few hundred to a call (Lua's stack bounds unpack)
  redis.call('RPUSH', bkey .. ':trajs', unpack(ids))
  redis.call('RPUSH', bkey .. ':ready', unpack(ids))
  ids = {}
end
for i, task in ipairs(cmsgpack.unpack(ARGV[15])) do
  local g = i - 1
  for s = 0, size - 1 do
    local tid = bid .. '-' .. g .. '-' .. s
    redis.call('HSET', p .. 'traj:' .. tid, 'state', 'queued', 'batch', bid, 'group', g, 'sample', s,
               'task', task, 'attempts', 0)
    ids[#ids + 1] = tid
    if #ids == 500 then push() end
  end
end
if #ids > 0 then push() end
redis.call('INCRBY', p .. 'queued', ARGV[6])
redis.call('ZADD', p .. 'tenant:' .. tenant .. ':ready', r, bid)
rescore(p, tenant)
wake(p, tonumber(ARGV[6]))
return {bid, 1}
"""

CLAIM = _SHARE_FN + """
-- ARGV: prefix, lease deadline ms, token (suffixed per claim), worker, now, most to claim.
-- Returns {tid, attempt, restarts, token, batch, group, sample, task, ...}: up to that many, fewest
-- when nothing is ready (the last four are the trajectory's own: its worker need not read them).
local p, want = ARGV[1], tonumber(ARGV[6])
local out = {}
local scanned = 0  -- bounds the work of one call however many stale ids lie in the way
local function group_of(tid) return string.match(tid, '^(.*)%-[0-9]+$') end
while #out < want * 8 and scanned < 1000 do
  local picked = nil
  for page = 0, 9 do  -- the lowest share first, past tenants at their cap (at most 1,000 looked at)
    local tenants = redis.call('ZRANGE', p .. 'tenants', page * 100, page * 100 + 99)
    for _, tenant in ipairs(tenants) do
      local sk = share_key(p, tenant)
      local cap = tonumber(redis.call('HGET', sk, 'cap') or '0')
      if cap <= 0 or tonumber(redis.call('HGET', sk, 'running') or '0') < cap then picked = tenant break end
    end
    if picked or #tenants < 100 then break end
  end
  if not picked then break end
  local sk, rk = share_key(p, picked), p .. 'tenant:' .. picked .. ':ready'
  local cap = tonumber(redis.call('HGET', sk, 'cap') or '0')
  local group = nil
  while #out < want * 8 and scanned < 1000 do
    local first = redis.call('ZRANGE', rk, 0, 0)
    if #first == 0 then break end
    local bid = first[1]
    local bkey = p .. 'batch:' .. bid
    local lkey = bkey .. ':ready'
    local tid = redis.call('LINDEX', lkey, 0)
    if not tid then
      redis.call('ZREM', rk, bid)  -- the batch has nothing more ready
      if group then break end
    elseif group and group_of(tid) ~= group then
      break  -- the group is all claimed: choose the tenant again
    else
      redis.call('LPOP', lkey)
      scanned = scanned + 1
      local tkey = p .. 'traj:' .. tid
      if redis.call('HGET', tkey, 'state') == 'queued' then
        local token = ARGV[3] .. string.format('%x', #out / 8)
        redis.call('HSET', tkey, 'state', 'running', 'token', token, 'worker', ARGV[4], 'started_at', ARGV[5])
        local attempt = tonumber(redis.call('HGET', tkey, 'attempts') or '0') + 1
        local restarts = tonumber(redis.call('HGET', tkey, 'restarts') or '0')
        redis.call('ZADD', p .. 'leases', ARGV[2], tid)
        redis.call('HINCRBY', bkey, 'n:queued', -1)
        redis.call('HINCRBY', bkey, 'n:running', 1)
        if redis.call('HGET', bkey, 'state') == 'queued' then redis.call('HSET', bkey, 'state', 'running') end
        if redis.call('DECR', p .. 'queued') < 0 then redis.call('SET', p .. 'queued', 0) end
        local running = redis.call('HINCRBY', sk, 'running', 1)
        out[#out + 1], out[#out + 2], out[#out + 3], out[#out + 4] = tid, attempt, restarts, token
        local f = redis.call('HMGET', tkey, 'batch', 'group', 'sample', 'task')
        out[#out + 1], out[#out + 2], out[#out + 3], out[#out + 4] = f[1], f[2], f[3], f[4]
        group = group_of(tid)
        if cap > 0 and running >= cap then break end
      end
      -- anything else is a stale id (cancelled while queued): dropped, look further
    end
  end
  rescore(p, picked)
end
return out
"""

HEARTBEAT = """
-- ARGV: prefix, deadline ms, then (tid, token) pairs: a worker renews every lease it holds in one
-- call (a few a turn at 100k in flight, not 100k/period calls). Returns one code per pair:
-- 0 lease lost, 1 ok, 2 batch cancelled
local p, deadline = ARGV[1], ARGV[2]
local out, cancelled = {}, {}
for i = 3, #ARGV, 2 do
  local f = redis.call('HMGET', p .. 'traj:' .. ARGV[i], 'token', 'state', 'batch')
  if f[1] ~= ARGV[i + 1] or f[2] ~= 'running' then
    out[#out + 1] = 0
  else
    redis.call('ZADD', p .. 'leases', 'XX', deadline, ARGV[i])
    local c = cancelled[f[3]]
    if c == nil then
      c = redis.call('HGET', p .. 'batch:' .. f[3], 'state') == 'cancelled'
      cancelled[f[3]] = c
    end
    out[#out + 1] = c and 2 or 1
  end
end
return out
"""

TURN = """
-- ARGV: prefix, then a worker's turns of one moment (one call) as one msgpack array, each
-- {tid, token, turn index, packed turn}. Returns per turn 0 lease lost, 1 recorded, -1 out of order
local out = {}
for _, it in ipairs(cmsgpack.unpack(ARGV[2])) do
  local tkey = ARGV[1] .. 'traj:' .. it[1]
  local f = redis.call('HMGET', tkey, 'token', 'state')
  if f[1] ~= it[2] or f[2] ~= 'running' then
    out[#out + 1] = 0
  else
    local lkey = tkey .. ':turns'
    local n, k = redis.call('LLEN', lkey), it[3]
    if k == n then
      redis.call('RPUSH', lkey, it[4])
      out[#out + 1] = 1
    elseif k < n then
      redis.call('LSET', lkey, k, it[4])  -- the same turn again (a write retried after a timeout)
      out[#out + 1] = 1
    else
      out[#out + 1] = -1
    end
  end
end
return out
"""

FINISH = FINISH_FN + """
-- ARGV: prefix, then a worker's finishes of one moment (one call) as one msgpack array, 10 per
-- trajectory: tid, token, new_state, result, reward, failure, now, ready ms (retry back-off),
-- counter to charge on a requeue ('attempts': the trajectory's retry budget; 'restarts': our
-- fault; ''), and the stats counted with the finish as 'field=n,field=n' ('' for none), in the
-- same step: a reader that sees the terminal event sees its tokens and prefill times counted too
-- (tokens and turns in its batch's totals as well).
-- Returns one 1 (recorded) or 0 (the token no longer holds the lease) per trajectory.
local p = ARGV[1]
local out = {}
for _, it in ipairs(cmsgpack.unpack(ARGV[2])) do
  local tid, result = it[1], it[4]
  local tkey = p .. 'traj:' .. tid
  local ok = 0
  if redis.call('HGET', tkey, 'token') == it[2] then
    ok = finish(p, tid, it[3], result, it[5], it[6], it[7], it[8])
    if ok == 1 and it[9] ~= '' then
      redis.call('HINCRBY', tkey, it[9], 1)
      redis.call('HINCRBY', p .. 'stats', it[9], 1)
    end
    if ok == 1 then
      local bkey = nil
      for field, n in string.gmatch(it[10], '([^=,]+)=([^,]+)') do
        redis.call('HINCRBY', p .. 'stats', field, n)
        if field == 'turns' or field == 'turned' or string.sub(field, 1, 7) == 'tokens:' then  -- the batch's too
          bkey = bkey or (p .. 'batch:' .. redis.call('HGET', tkey, 'batch'))
          redis.call('HINCRBY', bkey, 'sum:' .. field, n)
        end
      end
    end
  elseif result ~= '' and redis.call('HGET', tkey, 'result') == result then
    ok = 1  -- recorded already, by this very write: retried after its reply was lost
  end
  out[#out + 1] = ok
end
return out
"""

# A lease that lapsed (or whose holder is known dead) is our fault: a worker died, stalled,
# or lost Redis. It counts as a restart, never against the trajectory's attempts; only a
# poison task, one that keeps taking its workers down, runs out of restarts and fails.
# Returns {requeued, failed} for one trajectory.
_LAPSE_FN = FINISH_FN + """
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

REAP = _LAPSE_FN + """
-- ARGV: prefix, now ms, max restarts, now s, failure json.  Returns {requeued, failed}
local p = ARGV[1]
for _, tid in ipairs(redis.call('ZRANGEBYSCORE', p .. 'delayed', '-inf', ARGV[2], 'LIMIT', 0, 500)) do
  redis.call('ZREM', p .. 'delayed', tid)
  make_ready(p, tid, redis.call('HGET', p .. 'traj:' .. tid, 'batch'))
end
-- Ids queued by a version that kept one global list ({p}queue): moved into their batches' lists.
for _ = 1, 500 do
  local tid = redis.call('LPOP', p .. 'queue')
  if not tid then break end
  local bid = redis.call('HGET', p .. 'traj:' .. tid, 'batch')
  if bid then
    if not redis.call('HGET', p .. 'batch:' .. bid, 'rank') then
      redis.call('HSET', p .. 'batch:' .. bid, 'rank', redis.call('HGET', p .. 'batch:' .. bid, 'created_at') or 0)
    end
    make_ready(p, tid, bid)
  end
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

RELEASE = _LAPSE_FN + """
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

CANCEL = FINISH_FN + """
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
local tenant = redis.call('HGET', bkey, 'tenant') or 'default'
redis.call('DEL', bkey .. ':ready')  -- every id in it is stale now
redis.call('ZREM', p .. 'tenant:' .. tenant .. ':ready', ARGV[2])
rescore(p, tenant)
return n + 1
"""
