"""Every Redis key the system uses, in one place.

    {p}tenants                    zset   tenants with ready work -> running / weight (claim takes the lowest)
    {p}tenant:{t}:ready           zset   a tenant's batches with ready work -> rank (priority, expected length, age)
    {p}tenant:{t}:share           hash   weight, cap (most running at once), running
    {p}batch:{bid}:ready          list   a batch's trajectory ids ready to run (a group's members adjacent)
    {p}queued                     string trajectories queued (ready or backing off)
    {p}wake                       list   wake tokens (capped) that idle workers BLPOP instead of polling
    {p}expected                   hash   env -> expected seconds of one episode (workers' forecasters)
    {p}queue                      list   (old versions: one global ready list; the reaper drains it)
    {p}leases                     zset   trajectory id -> lease deadline (ms since epoch)
    {p}delayed                    zset   trajectory id -> when a retry may run again (ms since epoch)
    {p}batches                    zset   batch id -> created at (s)
    {p}batch:{bid}                hash   state, request json, counts per trajectory state, fingerprint (with a key)
    {p}batch:{bid}:trajs          list   trajectory ids in submission order
    {p}batch:{bid}:events         stream one entry per trajectory reaching a terminal state
    {p}traj:{tid}                 hash   state, spec json, attempts (charged), restarts (ours), lease token, result json
    {p}traj:{tid}:turns           list   the running attempt's finished turns (Turn json), until its result is written
    {p}idem:{key}                 string batch id for an idempotency key (its batch keeps the request's fingerprint)
    {p}engines                    hash   engine id -> EngineInfo json
    {p}engine:{id}:load           hash   worker id -> "tokens@unix time" it has in flight on that engine (TTL)
    {p}engine:{id}:down           string present while a worker's probe finds the engine down (TTL)
    {p}launch:profiles:{model}    hash   engine size (GPUs) -> the step model the allocator measured there (json)
    {p}launch:phase               list   the allocator's recent decisions: time and demand (json, newest first, capped)
    {p}workers                    hash   env worker id -> WorkerInfo json
    {p}worker:{id}:alive          string present while the env worker heartbeats (TTL)
    {p}stats                      hash   counters: finished:{state}, failure:{kind}, tokens:{kind}, attempts, restarts,
                                         prefill:{bucket}, prefill_sum_us (per-turn prefill histogram)
    {p}restarts                   hash   component -> times its supervisor (`rollout up`) restarted it
    {p}up:{name}                  string set by `rollout up` when it registers engine {name}; gone = Redis lost data
    {p}weights:reload:{eid}       string held (with a TTL) by the gateway loading engine {eid}'s pushed weights again
    {p}worker:{id}:phases         hash   a rollout worker's live trajectories by phase + forecast (TTL)
    {p}worker:{id}:pools          hash   an env worker's resource pool use, {kind}:{state} -> n (TTL)
    {p}tenant:{t}:batches         zset   a tenant's batch ids -> created at
    {p}tenant:{t}:open            string a tenant's open (queued + running) trajectories, for its quota
    {p}apikey:{sha256}            string Principal json for an API key (only its hash is stored)
    {p}session:{sid}              hash   tenant, trajectory json of an OpenAI-compatible session

The prefix lets several deployments (or tests) share one Redis. The Lua scripts in
`scheduler.lua` build the same names from the prefix (a script may only touch keys it can
name); the tests read everything back through `Keys`, so a drift between the two fails them.
"""

from __future__ import annotations

from dataclasses import dataclass


def trajectory_id(batch_id: str, group: int, sample: int) -> str:
    """A trajectory's id, `{batch}-{group}-{sample}`: read back by `batch_of` (batch ids are hex,
    without '-'). The enqueue script (`scheduler.lua.ENQUEUE`) names a batch's trajectories the same way."""
    return f"{batch_id}-{group}-{sample}"


def batch_of(trajectory_id: str) -> str:
    return trajectory_id.split("-", 1)[0]


@dataclass(frozen=True, slots=True)
class Keys:
    prefix: str = "rs:"

    @property
    def legacy_queue(self) -> str:
        return f"{self.prefix}queue"

    @property
    def tenants(self) -> str:
        return f"{self.prefix}tenants"

    def tenant_ready(self, tenant: str) -> str:
        return f"{self.prefix}tenant:{tenant}:ready"

    def tenant_share(self, tenant: str) -> str:
        return f"{self.prefix}tenant:{tenant}:share"

    def batch_ready(self, bid: str) -> str:
        return f"{self.prefix}batch:{bid}:ready"

    @property
    def queued(self) -> str:
        return f"{self.prefix}queued"

    @property
    def wake(self) -> str:
        return f"{self.prefix}wake"

    @property
    def expected(self) -> str:
        return f"{self.prefix}expected"

    @property
    def leases(self) -> str:
        return f"{self.prefix}leases"

    @property
    def delayed(self) -> str:
        return f"{self.prefix}delayed"

    @property
    def batches(self) -> str:
        return f"{self.prefix}batches"

    def batch(self, bid: str) -> str:
        return f"{self.prefix}batch:{bid}"

    def batch_trajs(self, bid: str) -> str:
        return f"{self.prefix}batch:{bid}:trajs"

    def batch_events(self, bid: str) -> str:
        return f"{self.prefix}batch:{bid}:events"

    def traj(self, tid: str) -> str:
        return f"{self.prefix}traj:{tid}"

    def traj_turns(self, tid: str) -> str:
        return f"{self.prefix}traj:{tid}:turns"

    def idem(self, key: str) -> str:
        return f"{self.prefix}idem:{key}"

    @property
    def engines(self) -> str:
        return f"{self.prefix}engines"

    def engine_load(self, eid: str) -> str:
        return f"{self.prefix}engine:{eid}:load"

    def engine_down(self, eid: str) -> str:
        return f"{self.prefix}engine:{eid}:down"

    def launch_profiles(self, model: str) -> str:
        return f"{self.prefix}launch:profiles:{model}"

    @property
    def launch_phase(self) -> str:
        return f"{self.prefix}launch:phase"

    @property
    def turn_timings(self) -> str:
        """Recent turns' engine timings (a capped list): what the allocator measures speed from."""
        return f"{self.prefix}timings"

    @property
    def workers(self) -> str:
        return f"{self.prefix}workers"

    def worker_alive(self, wid: str) -> str:
        return f"{self.prefix}worker:{wid}:alive"

    def worker_pools(self, wid: str) -> str:
        return f"{self.prefix}worker:{wid}:pools"

    def worker_phases(self, wid: str) -> str:
        return f"{self.prefix}worker:{wid}:phases"

    @property
    def stats(self) -> str:
        return f"{self.prefix}stats"

    @property
    def component_restarts(self) -> str:
        return f"{self.prefix}restarts"

    def up_registered(self, name: str) -> str:
        return f"{self.prefix}up:{name}"

    def weights_reload(self, engine_id: str) -> str:
        return f"{self.prefix}weights:reload:{engine_id}"

    def tenant_batches(self, tenant: str) -> str:
        return f"{self.prefix}tenant:{tenant}:batches"

    def tenant_open(self, tenant: str) -> str:
        return f"{self.prefix}tenant:{tenant}:open"

    def session(self, sid: str) -> str:
        return f"{self.prefix}session:{sid}"

    def apikey(self, key_hash: str) -> str:
        return f"{self.prefix}apikey:{key_hash}"
