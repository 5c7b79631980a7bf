"""One simulated rollout: a workload on N simulated GPUs under one allocation policy.

The scheduler pieces are the real ones, called through the same verbs the live worker uses:
`scheduler.lifecycle.Lifecycle` (on_submit / on_prefill / on_decode / on_tool / on_done),
`scheduler.forecast.Forecaster` (observes the lifecycle; forecast), `scheduler.allocator.
Allocator` (allocate / drained) and `scheduler.router.RoleAware` (pick_prefill / pick_decode).

A turn: the trajectory's prompt delta arrives → the router picks a prefill engine, which
prefills whatever of the context it has not cached → the router picks the decode engine (the
same one if it is mixed; otherwise the KV not already there is transferred, at
`ClusterCost.transfer_time`) → the response decodes → the environment step takes its latency
→ next turn, or done.

Policies: `Policy.colocated()` (every engine mixed, never moves), `Policy.static(p)` (p prefill
engines, the rest decode, never moves), `Policy.guided()` (starts all mixed; every `control_s`
the forecaster and allocator may move engines, draining them first).

Modes: `sync` runs `rounds` batches of per_gpu·N trajectories with a barrier between them;
`async` keeps per_gpu·N in flight and refills as each ends, rounds·per_gpu·N in all.

Non-goals: failures and retries, weight updates, the Redis queue (see benchmarks/queue_overhead.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from benchmarks.sim.clock import EventLoop
from benchmarks.sim.cost import DEFAULT, PRESETS, ClusterCost
from benchmarks.sim.gpu import SimGPU
from benchmarks.sim.workload import Episode, Workload
from scheduler.allocator import Allocator, AllocatorConfig, Capacity, Layout
from scheduler.forecast import Forecaster, ForecastError
from scheduler.lifecycle import Lifecycle
from scheduler.roles import EngineState
from scheduler.router import NoEngine, RoleAware


@dataclass(slots=True, frozen=True)
class Policy:
    name: str
    prefill: int | None = None  # fixed: this many prefill engines, the rest decode (0: all mixed)

    @staticmethod
    def colocated() -> "Policy":
        return Policy("colocated", 0)

    @staticmethod
    def static(prefill: int) -> "Policy":
        return Policy(f"static-{prefill}P", prefill)

    @staticmethod
    def guided() -> "Policy":
        return Policy("guided")


@dataclass(slots=True)
class Result:
    workload: str
    mode: str
    gpus: int
    policy: str
    makespan_s: float
    trajectories: int
    turns: int
    prefill_tokens: int  # what engines actually prefilled (recompute included)
    transferred_tokens: int
    moves: int
    utilization: float  # busy GPU-seconds / (GPUs · makespan)
    events: int
    forecast: ForecastError | None = None
    layouts: list = field(default_factory=list)  # (t, prefill, decode, mixed) after each move


@dataclass(slots=True)
class _Traj:
    ep: Episode
    turn: int = 0
    context: int = 0
    engines: dict = field(default_factory=dict)  # engines that cache it (insertion-ordered set)


class _Loads(Mapping):
    """Engine loads, read only when the router asks (a sticky hit reads one)."""

    def __init__(self, gpus: dict[str, SimGPU], able: Mapping):
        self.gpus, self.able = gpus, able

    def __getitem__(self, e: str) -> int:
        return self.gpus[e].load()

    def __contains__(self, e: object) -> bool:
        return e in self.able

    def __iter__(self) -> Iterator[str]:
        return iter(self.able)

    def __len__(self) -> int:
        return len(self.able)


class Cluster:
    def __init__(self, workload: Workload, gpus: int, policy: Policy, mode: str = "sync", seed: int = 0,
                 cost: ClusterCost | None = None, control_s: float = 5.0, horizon_s: float = 15.0,
                 config: AllocatorConfig | None = None):
        if mode not in ("sync", "async"):
            raise ValueError(f"mode must be sync or async, not {mode!r}")
        self.workload, self.policy, self.mode, self.seed = workload, policy, mode, seed
        self.cost = cost or PRESETS[DEFAULT]()
        self.control_s = control_s
        self.loop = EventLoop()
        self.guided = policy.prefill is None
        c = self.cost
        self.capacity = Capacity(prefill_tok_s=c.prefill_tokens_per_s, step=c.prior(), kv_tokens=c.kv_capacity_tokens)
        measure = self._measure if self.guided else None
        self._measured = 0
        self.gpus = {f"g{i:03d}": SimGPU(f"g{i:03d}", c, self.loop, self._prefilled, self._decoded, measure)
                     for i in range(gpus)}
        p = policy.prefill or 0
        layout = Layout(p, gpus - p, 0) if p else Layout(0, 0, gpus)
        self.allocator = Allocator(self.gpus, self.capacity, config, layout)
        self.forecaster = Forecaster(horizon_s)
        self.lifecycle = Lifecycle(clock=lambda: self.loop.now, observers=[self.forecaster] if self.guided else [])
        self.router = RoleAware()
        self.roles = self.allocator.roles()  # the allocator's, refreshed when it moves an engine
        self.trajs: dict[str, _Traj] = {}
        self.in_flight = workload.per_gpu * gpus
        self.total = workload.rounds * self.in_flight
        self.submitted = self.done = self.turns = self.transferred = 0
        self.pending: list[tuple[str, str, str | None]] = []  # (what, trajectory, prefill engine) awaiting a role
        self.layouts: list[tuple[float, int, int, int]] = []

    # --- running ------------------------------------------------------------------------
    def run(self) -> Result:
        if self.mode == "sync":
            self._submit_round()
        else:
            for _ in range(self.in_flight):
                self._submit()
        if self.guided:
            self.loop.at(0.0, self._control)
        end = self.loop.run()
        if self.done != self.total:
            raise RuntimeError(f"simulation stalled with {self.total - self.done} trajectories unfinished")
        busy = sum(g.busy_s for g in self.gpus.values())
        return Result(self.workload.name, self.mode, len(self.gpus), self.policy.name, end, self.done, self.turns,
                      sum(g.prefilled_tokens for g in self.gpus.values()), self.transferred,
                      len(self.allocator.history), busy / (len(self.gpus) * end) if end else 0.0, self.loop.events,
                      self.forecaster.error(end, final=True) if self.guided else None, self.layouts)

    def _progress(self) -> float:
        if self.mode == "sync":
            return (self.submitted // self.in_flight) / max(self.workload.rounds - 1, 1)
        return self.submitted / max(self.total - 1, 1)

    def _submit_round(self) -> None:
        for _ in range(self.in_flight):
            self._submit()

    def _submit(self) -> None:
        ep = self.workload.episode(self.seed, self.submitted, self._progress())
        self.submitted += 1
        self.trajs[ep.id] = _Traj(ep)
        self.lifecycle.on_submit(ep.id, ep.env, ep.prompt)
        self._start_turn(ep.id, ep.prompt)

    # --- a turn -------------------------------------------------------------------------
    def _loads(self) -> "_Loads":
        return _Loads(self.gpus, self.roles)

    def _start_turn(self, tid: str, delta: int) -> None:
        tr = self.trajs[tid]
        self.lifecycle.on_prefill(tid, delta)
        tr.context += delta
        self._prefill(tid)

    def _prefill(self, tid: str) -> None:
        tr = self.trajs[tid]
        try:
            eid = self.router.pick_prefill(tid, self._loads(), self.roles)
        except NoEngine:
            self.pending.append(("prefill", tid, None))
            return
        gpu = self.gpus[eid]
        tr.engines[eid] = None
        hit = min(gpu.hit(tid), tr.context - 1)
        gpu.add_prefill(tid, tr.context - hit, hit)

    def _prefilled(self, gpu: SimGPU, tid: str) -> None:
        gpu.touch(tid, self.trajs[tid].context)
        self._to_decode(tid, gpu.id)
        self._check_drained(gpu)

    def _to_decode(self, tid: str, prefilled_on: str) -> None:
        tr = self.trajs[tid]
        try:
            eid = self.router.pick_decode(tid, self._loads(), prefilled_on, self.roles)
        except NoEngine:
            self.pending.append(("decode", tid, prefilled_on))
            return
        dst = self.gpus[eid]
        tr.engines[eid] = None
        missing = tr.context - dst.hit(tid)
        if eid == prefilled_on or missing <= 0:
            self._join_decode((tid, eid))
            return
        self.transferred += missing
        dst.incoming += 1
        self.loop.after(self.cost.transfer_time(missing), self._arrived, (tid, eid))

    def _arrived(self, arg: tuple[str, str]) -> None:
        self.gpus[arg[1]].incoming -= 1
        self._join_decode(arg)

    def _join_decode(self, arg: tuple[str, str]) -> None:
        tid, eid = arg
        tr = self.trajs[tid]
        self.lifecycle.on_decode(tid)
        self.gpus[eid].add_decode(tid, tr.context, tr.ep.turns[tr.turn].response)

    def _decoded(self, gpu: SimGPU, tid: str) -> None:
        tr = self.trajs[tid]
        spec = tr.ep.turns[tr.turn]
        tr.context += spec.response
        self.turns += 1
        self.lifecycle.on_tool(tid, spec.response, tool=tr.ep.tool)
        self.loop.after(spec.latency_s, self._stepped, tid)
        self._check_drained(gpu)

    def _stepped(self, tid: str) -> None:
        tr = self.trajs[tid]
        if tr.turn + 1 >= len(tr.ep.turns):
            self._finish(tid)
            return
        obs = tr.ep.turns[tr.turn].observation
        tr.turn += 1
        self._start_turn(tid, obs)

    def _finish(self, tid: str) -> None:
        tr = self.trajs.pop(tid)
        self.lifecycle.on_done(tid)
        self.router.forget(tid)
        for eid in tr.engines:
            self.gpus[eid].forget(tid)
        self.done += 1
        if self.mode == "async":
            if self.submitted < self.total:
                self._submit()
        elif self.done == self.submitted and self.submitted < self.total:
            self._submit_round()  # the barrier: the next batch starts when this one has ended
        if self.done == self.total:
            self.loop.stop()

    # --- the control loop (guided only) ---------------------------------------------------
    def _measure(self, batch: int, context: float, chunk: float, seconds: float) -> None:
        self._measured += 1
        if self._measured % 8 == 0:  # a sample of steps is plenty for a 4-parameter fit
            self.capacity.observe_step(batch, context, chunk, seconds)

    def _control(self, _=None) -> None:
        now = self.loop.now
        demand = self.forecaster.forecast(self.lifecycle.live(), now)
        drain = {e: g.drain_s() for e, g in self.gpus.items()}
        moves = self.allocator.allocate(demand, drain, now)
        if moves:
            self.roles = self.allocator.roles()
            lay = self.allocator.layout()
            self.layouts.append((round(now, 3), lay.prefill, lay.decode, lay.mixed))
            for m in moves:
                self._check_drained(self.gpus[m.engine])
        self.loop.after(self.control_s, self._control)

    def _check_drained(self, gpu: SimGPU) -> None:
        st = self.allocator.engines[gpu.id]
        if st.state is EngineState.draining and gpu.empty():
            self.allocator.drained(gpu.id, self.loop.now)
            self.roles = self.allocator.roles()
            self._retry()

    def _retry(self) -> None:
        waiting, self.pending = self.pending, []
        for what, tid, eid in waiting:
            if what == "prefill":
                self._prefill(tid)
            else:
                self._to_decode(tid, eid)
