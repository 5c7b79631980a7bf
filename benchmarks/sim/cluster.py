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
engines, the rest decode, never moves), `Policy.guided()` (starts all mixed, or warm in the roles
the phase before ended in, as live engines keep theirs between batches; every `control_s`
the forecaster and allocator may move engines, draining them first; the allocator's `Capacity`
starts from a vague prior and is fitted to the simulated engines' steps, as the live service
fits it to vLLM's), `Policy.guided(perfect=True)` (the same, with the true demand of the next
horizon instead of the forecast), `Policy.oracle()` (true demand and the true cost model).

KV across turns and role switches, in simulated time:
- `kv_push` (default on): when a turn decoded on another engine than the one that prefilled it,
  the decode engine pushes the response's KV back to the prefill engine (`ClusterCost.
  transfer_time`), so the next turn prefills only the new observation, as colocation does; and
  a prefill engine that lacks a conversation another engine holds (after a role switch, or an
  eviction) pulls it when the transfer beats recomputing it. Off, a split turn recomputes the
  previous response, and a moved conversation all of its context, on the prefill engine.
- a role switch: with `ClusterCost.routing_switch` (kv_both engines, the default) only routing
  changes: at once to decode or mixed (in-flight work finishes where it is), after draining its
  decodes to prefill; otherwise (`ClusterCost.restart_switch()`) the engine drains, takes its
  new role `ClusterCost.switch_s` later (graph capture), its prefix cache flushed if
  `ClusterCost.flush_on_switch`.

Modes: `sync` runs `rounds` batches of per_gpu·N trajectories with a barrier between them;
`async` keeps per_gpu·N in flight and refills as each ends, rounds·per_gpu·N in all.

Non-goals: failures and retries, weight updates, the Redis queue (see benchmarks/queue_overhead.py).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from benchmarks.sim.clock import EventLoop
from benchmarks.sim.cost import DEFAULT, PRESETS, ClusterCost
from benchmarks.sim.gpu import STEP_KINDS, SimGPU
from benchmarks.sim.workload import Episode, Workload
from scheduler.allocator import Allocator, AllocatorConfig, Capacity, Layout
from scheduler.forecast import Demand, ForecastError, Forecaster
from scheduler.lifecycle import Lifecycle, Phase
from scheduler.roles import EngineRole, EngineState
from scheduler.router import NoEngine, RoleAware


@dataclass(slots=True, frozen=True)
class Policy:
    name: str
    prefill: int | None = None  # fixed: this many prefill engines, the rest decode (0: all mixed)
    perfect: bool = False  # guided: the true demand of the next horizon instead of the forecast
    true_cost: bool = False  # guided: the allocator gets the true cost model instead of measuring
    hold: bool = False  # guided, held colocated: forecasts and measures, records each decision's inputs, never moves

    @staticmethod
    def colocated() -> "Policy":
        return Policy("colocated", 0)

    @staticmethod
    def static(prefill: int, name: str = "") -> "Policy":
        return Policy(name or f"static-{prefill}P", prefill)

    @staticmethod
    def guided(perfect: bool = False) -> "Policy":
        return Policy("guided-perfect" if perfect else "guided", perfect=perfect)

    @staticmethod
    def held(perfect: bool = False) -> "Policy":
        """Colocated under the guided control loop: every decision's demand and measured capacity are
        kept (`Cluster.decisions`) so the allocator's estimate can be set beside the runs it scores."""
        return Policy("held-perfect" if perfect else "held", perfect=perfect, hold=True)

    @staticmethod
    def oracle() -> "Policy":
        return Policy("oracle", perfect=True, true_cost=True)


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
    transferred_tokens: int  # KV moved prefill -> decode
    moves: int
    utilization: float  # busy GPU-seconds / (GPUs · makespan)
    events: int
    forecast: ForecastError | None = None
    layouts: list = field(default_factory=list)  # (t, prefill, decode, mixed) after each move
    pushed_tokens: int = 0  # KV moved to a prefill engine: responses pushed back, contexts pulled (kv_push)
    # where the engines' time went, by kind of step (`SimGPU.steps`), summed over engines: engine-
    # seconds, tokens decoded and prefilled, and the mean decode batch; what a split gains or loses
    # against colocation, read off (docs: benchmarks/sim/README.md)
    steps: dict = field(default_factory=dict)


@dataclass(slots=True, frozen=True)
class Warm:
    """A guided run's learned state: the capacity fit, the forecaster's statistics and the roles
    the engines ended in. RL training rolls out the same environments step after step, and the
    live service keeps all three between batches (the allocator process and every worker's
    forecaster live on; an engine keeps its role until moved), so a rollout phase after the first
    starts from what the one before it learned; `Cluster(warm=...)` starts a run from it (copied:
    the source is left as it was)."""

    capacity: Capacity
    forecaster: Forecaster
    layout: Layout | None = None  # the roles the engines ended in: they keep them into the next phase
    capacities: dict | None = None  # engines of several sizes: each size's fit (by GPUs an engine)
    roles: dict | None = None  # ... and each engine's role (a layout cannot say which size holds which)


def _first_capacity(cost: ClusterCost, true_cost: bool) -> Capacity:
    """What a guided run starts from for engines of `cost`: the cost model's own step times
    (`true_cost`), else a vague prior (Capacity's defaults); memory and step budgets are configuration."""
    step = {"step": cost.prior()} if true_cost else {}
    return Capacity(**step, kv_tokens=cost.kv_capacity_tokens, chunk_tokens=cost.step_tokens,
                    rank_tokens=cost.prefill_chunk_tokens)


@dataclass(slots=True)
class _Traj:
    ep: Episode
    turn: int = 0
    context: int = 0
    engines: dict = field(default_factory=dict)  # engines that cache it (insertion-ordered set)
    prefill_on: str | None = None  # the engine that prefilled its current turn
    decode_on: str | None = None
    tool_end: float = 0.0  # when its environment step returns


class _Loads(dict):
    """Engine loads, read only when the router asks (a sticky hit reads one), each at most once:
    one is made for each routing decision, during which no engine changes (the router reads an
    engine's load up to three times a decision: 128 engines read 384 times). A dict, so that a
    load read again costs a dict lookup; read it as a Mapping (`[]`, `in`, iteration, `len`: the
    engines that may serve), not through dict's own `get` or `keys`, which see only what was read."""

    def __init__(self, load: dict[str, Callable[[], int]], able: Mapping):
        super().__init__()
        self.load, self.able = load, able  # `load`: each engine's `SimGPU.load`

    def __missing__(self, e: str) -> int:
        n = self[e] = self.load[e]()
        return n

    def __contains__(self, e: object) -> bool:
        return e in self.able

    def __iter__(self) -> Iterator[str]:
        return iter(self.able)

    def __len__(self) -> int:
        return len(self.able)


class Cluster:
    def __init__(self, workload: Workload, gpus: int, policy: Policy, mode: str = "sync", seed: int = 0,
                 cost: ClusterCost | None = None, control_s: float = 5.0, horizon_s: float = 15.0,
                 config: AllocatorConfig | None = None, kv_push: bool = True, warm: "Warm | None" = None,
                 prefill_cost: ClusterCost | None = None, in_flight: int | None = None, prefill_engines: int = 0):
        """`prefill_cost`: a static split's prefill engines as their own kind of engine (per-role
        parallelism: e.g. the 32B at TP4 prefilling for decode engines at TP2; `cost` is then the
        decode engines'). Guided, the first `prefill_engines` engines are of that kind and start
        prefilling, the rest decoding (a per-role launch), and the allocator moves roles within
        each size (`Allocator(sizes=...)`), measuring each size's speed on its own. `in_flight`:
        trajectories in flight in all (default: the workload's per engine times the engines), so
        that layouts of different engine counts on the same GPUs carry the same load."""
        if mode not in ("sync", "async"):
            raise ValueError(f"mode must be sync or async, not {mode!r}")
        if prefill_cost is not None and not (policy.prefill or (policy.prefill is None and prefill_engines)):
            raise ValueError("prefill_cost is for a split's prefill engines: the policy has none")
        if prefill_engines and (prefill_cost is None or policy.prefill is not None or not 0 < prefill_engines < gpus):
            raise ValueError("prefill_engines: a guided run's prefill engines of `prefill_cost`, fewer than the engines")
        self.workload, self.policy, self.mode, self.seed = workload, policy, mode, seed
        self.cost = cost or PRESETS[DEFAULT]()
        self.control_s = control_s
        self.loop = EventLoop()
        self.guided = policy.prefill is None
        self.kv_push = kv_push
        self.horizon_s = horizon_s
        c = self.cost
        if warm is not None and self.guided and not policy.true_cost:
            self.capacity = copy.deepcopy(warm.capacity)  # what an earlier phase measured
        else:
            self.capacity = _first_capacity(c, policy.true_cost)
        # a measured capacity acts only after two refits of its step model (not on its vague prior)
        config = config or AllocatorConfig(switch_s=c.switch_s, response_kv_pushed=kv_push,
                                           routing_only=c.routing_switch,
                                           min_samples=0 if policy.true_cost else 2 * self.capacity.refit_every,
                                           min_observed=0.5)
        self._measured = 0
        # engine ids sort in order, and the allocator gives the first `policy.prefill` the prefill role
        p = policy.prefill or prefill_engines
        costs = {f"g{i:03d}": prefill_cost if prefill_cost and i < p else c for i in range(gpus)}
        # engines of two sizes (guided over a per-role launch): each size's speed is measured on its own
        self.capacities: dict[int, Capacity] = {}
        if prefill_engines:
            if prefill_cost.gpus == c.gpus:
                raise ValueError("prefill_engines: the prefill engines' size must differ from the rest's")
            for k, kc in {c.gpus: c, prefill_cost.gpus: prefill_cost}.items():
                self.capacities[k] = copy.deepcopy(warm.capacities[k]) if warm is not None and warm.capacities else \
                    _first_capacity(kc, policy.true_cost)
        measuring = self.guided and not policy.true_cost

        def measure(cost: ClusterCost):
            if not measuring or not self.capacities:
                return self._measure if measuring else None
            cap = self.capacities[cost.gpus]
            return lambda *step: self._measure(*step, capacity=cap)

        self.gpus = {e: SimGPU(e, costs[e], self.loop, self._prefilled, self._decoded, measure(costs[e]))
                     for e in costs}
        self._load = {e: g.load for e, g in self.gpus.items()}  # what a routing decision reads (`_Loads`)
        layout = Layout(p, gpus - p, 0) if p else Layout(0, 0, gpus)
        if warm is not None and self.guided and warm.layout is not None and not policy.hold and warm.roles is None:
            layout = warm.layout  # an engine keeps its role between batches, as live engines do
        # the engines were up before the run: their starting roles are not a recent move (dwell)
        sizes = {e: k.gpus for e, k in costs.items()} if self.capacities else None
        self.allocator = Allocator(self.gpus, self.capacity, config, layout, now=-config.dwell_s, sizes=sizes,
                                   capacities=self.capacities or None)
        if warm is not None and self.guided and warm.roles is not None and not policy.hold:
            for e, role in warm.roles.items():  # each engine back in the role it ended in
                self.allocator.engines[e] = EngineRole(e)
                self.allocator.engines[e].ready(-config.dwell_s, role)
        self.forecaster = Forecaster(horizon_s)
        if warm is not None and self.guided:
            self.forecaster = copy.deepcopy(warm.forecaster)
            self.forecaster.restart_clock()
        self.lifecycle = Lifecycle(clock=lambda: self.loop.now, observers=[self.forecaster] if self.guided else [])
        self.router = RoleAware()
        self.roles = self.allocator.roles()  # the allocator's, refreshed when it moves an engine
        self.trajs: dict[str, _Traj] = {}
        self.in_flight = in_flight or workload.per_gpu * gpus
        self.total = workload.rounds * self.in_flight
        self.submitted = self.done = self.turns = self.transferred = self.pushed = 0
        self._flipping: set[str] = set()
        self.pending: list[tuple[str, str, str | None]] = []  # (what, trajectory, prefill engine) awaiting a role
        self.layouts: list[tuple[float, int, int, int]] = []
        self.decisions: list[tuple[float, Demand, Capacity]] = []  # held: (time, demand, capacity) at each decision

    # --- running ------------------------------------------------------------------------
    def warm(self) -> "Warm":
        """What this run learned, to start another from (after `run`)."""
        roles = {e: s.role for e, s in self.allocator.engines.items()} if self.capacities else None
        return Warm(self.capacity, self.forecaster, self.allocator.layout(), self.capacities or None, roles)

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
                      self.forecaster.error(end, final=True) if self.guided else None, self.layouts, self.pushed,
                      self._steps())

    def _steps(self) -> dict:
        out = {}
        for kind in STEP_KINDS:
            s, dec, pre, seq_s = (sum(g.steps[kind][i] for g in self.gpus.values()) for i in range(4))
            out[kind] = {"engine_s": round(s, 3), "decoded_tokens": round(dec), "prefilled_tokens": round(pre),
                         "mean_batch": round(seq_s / s, 2) if s else 0.0}
        return out

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
        return _Loads(self._load, self.roles)

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
        tr.prefill_on = eid
        hit = min(gpu.hit(tid), tr.context - 1)
        if tr.turn == 0 and tr.ep.group is not None:  # a GRPO sibling may have prefilled the prompt here
            hit = max(hit, min(gpu.hit(tr.ep.group), tr.context - 1))
        if self.kv_push:  # another engine holds more of the conversation: pull it when cheaper than recompute
            more, src = max(((min(self.gpus[e].hit(tid), tr.context - 1), e) for e in tr.engines if e != eid),
                            default=(0, eid))
            extra = more - hit
            # a busy engine pulls (recompute would delay every prefill queued behind it; a pull costs
            # the link, not the engine); an idle one recomputes when that is quicker, priced as it
            # would run, attending to what precedes it
            if extra > 0 and (gpu.queued_prefill() > 0
                              or self._transfer_s(extra, src, eid) < gpu.cost.prefill_time(extra, hit)):
                self.pushed += extra
                gpu.incoming += 1
                gpu.incoming_tokens += tr.context - more
                self.loop.after(self._transfer_s(extra, src, eid), self._pulled, (tid, eid, more))
                return
        gpu.add_prefill(tid, tr.context - hit, hit)

    def _pulled(self, arg: tuple[str, str, int]) -> None:
        tid, eid, cached = arg
        gpu, tr = self.gpus[eid], self.trajs[tid]
        gpu.incoming -= 1
        gpu.incoming_tokens -= tr.context - cached
        gpu.touch(tid, cached)
        gpu.add_prefill(tid, tr.context - cached, cached)

    def _prefilled(self, gpu: SimGPU, tid: str) -> None:
        tr = self.trajs[tid]
        gpu.touch(tid, tr.context)
        if tr.turn == 0 and tr.ep.group is not None:
            gpu.touch(tr.ep.group, tr.ep.prompt)  # the shared prompt, for the group's other members
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
        dst.incoming_tokens += tr.context
        self.loop.after(self._transfer_s(missing, prefilled_on, eid), self._arrived, (tid, eid))

    def _arrived(self, arg: tuple[str, str]) -> None:
        gpu = self.gpus[arg[1]]
        gpu.incoming -= 1
        gpu.incoming_tokens -= self.trajs[arg[0]].context
        self._join_decode(arg)

    def _join_decode(self, arg: tuple[str, str]) -> None:
        tid, eid = arg
        tr = self.trajs[tid]
        tr.decode_on = eid
        self.lifecycle.on_decode(tid)
        self.gpus[eid].add_decode(tid, tr.context, tr.ep.turns[tr.turn].response)

    def _decoded(self, gpu: SimGPU, tid: str) -> None:
        tr = self.trajs[tid]
        spec = tr.ep.turns[tr.turn]
        tr.context += spec.response
        self.turns += 1
        self.lifecycle.on_tool(tid, spec.response, tool=tr.ep.tool)
        tr.tool_end = self.loop.now + spec.latency_s
        self.loop.after(spec.latency_s, self._stepped, tid)
        if self.kv_push and tr.prefill_on not in (None, gpu.id) and tr.turn + 1 < len(tr.ep.turns):
            self._push(tid, tr.prefill_on, gpu.id)
        self._check_drained(gpu)

    def _transfer_s(self, tokens: int, src: str, dst: str) -> float:
        """KV of `tokens` from one engine to another. Each rank sends or receives its shard over
        its own port, so between engines of different TP the side with fewer ranks sets the pace."""
        a, b = self.gpus[src].cost, self.gpus[dst].cost
        return (a if a.tp <= b.tp else b).transfer_time(tokens)

    def _push(self, tid: str, eid: str, src: str) -> None:
        """The decode engine sends the response's KV back to the engine that prefilled the turn."""
        tr = self.trajs[tid]
        missing = tr.context - self.gpus[eid].hit(tid)
        if missing > 0:
            self.pushed += missing
            self.loop.after(self._transfer_s(missing, src, eid), self._pushed, (tid, eid, tr.context))

    def _pushed(self, arg: tuple[str, str, int]) -> None:
        tid, eid, ctx = arg
        gpu = self.gpus[eid]
        if tid in self.trajs and gpu.hit(tid) < ctx:  # still live, and not prefilled there meanwhile
            gpu.touch(tid, ctx)

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
    def _measure(self, batch: int, context: float, chunk: float, seconds: float, prefix: float,
                 capacity: Capacity | None = None) -> None:
        """An engine step's timing, as the live service reads it from vLLM: into `Capacity` (its
        size's, where the engines are of several sizes)."""
        self._measured += 1
        if self._measured % 8 == 0:  # a sample of steps is plenty for a 7-parameter fit
            (capacity or self.capacity).observe_step(batch, context, chunk, seconds, prefix)

    def _control(self, _=None) -> None:
        now = self.loop.now
        demand = self.forecaster.forecast(self.lifecycle.live(), now)  # scored even when not used
        if self.policy.perfect:
            demand = self._true_demand(now, self.horizon_s)
        if self.policy.hold:
            self.decisions.append((now, demand, copy.deepcopy(self.capacity)))
            self.loop.after(self.control_s, self._control)
            return
        drain = {e: g.drain_s() for e, g in self.gpus.items()}
        moves = self.allocator.allocate(demand, drain, now, {e: g._cache_total for e, g in self.gpus.items()})
        if moves:
            self.roles = self.allocator.roles()
            lay = self.allocator.layout()
            self.layouts.append((round(now, 3), lay.prefill, lay.decode, lay.mixed))
            for m in moves:
                self._check_drained(self.gpus[m.engine])
        self.loop.after(self.control_s, self._control)

    def _true_demand(self, now: float, h: float) -> Demand:
        """What the engines will really be asked for within `h` (the episodes are known here):
        the backlog, and every turn whose environment step returns within the horizon, timed
        with its prefill (as it runs alone) and the decode engines' recent pace (`SimGPU.pace_s`:
        timed at the step running now, which beside a prefill chunk is 10-30x a decode step, it
        foresaw half of what arrived in `web`), of each response what decodes before the horizon
        ends, and the conversations of the episodes whose last step returns within it.
        Same shape as `Forecaster.forecast`."""
        taus = [g.pace_s() for g in self.gpus.values() if g._seqs]
        tau = sum(taus) / len(taus) if taus else self.cost.decode_step_s
        p = dtok = seqs = ctx = turns = resp = attend = backlog = ending = 0.0
        n = 0
        for t in self.lifecycle.live():
            tr = self.trajs[t.id]
            n += 1
            ctx += t.context_tokens
            resp += t.last_response
            spec = tr.ep.turns
            if t.phase is Phase.tool:
                at = tr.tool_end - now
            else:
                seqs += 1
                if t.phase is Phase.decoding:
                    left, step = self.gpus[tr.decode_on].remaining(t.id)
                else:
                    p += t.pending_prefill
                    backlog += t.pending_prefill
                    attend += t.pending_prefill * (t.context_tokens - t.pending_prefill / 2)
                    turns += 1
                    left, step = spec[tr.turn].response, tau
                # its prefill first (as it would run alone: the queue before it is not counted)
                first = self.cost.prefill_time(t.pending_prefill, t.context_tokens - t.pending_prefill) \
                    if t.phase is not Phase.decoding else 0.0
                dtok += min(left, max(h - first, 0.0) / step)  # what it decodes within the horizon
                at = first + left * step + spec[tr.turn].latency_s
            turn = tr.turn
            before = t.context_tokens + (0 if t.phase is Phase.tool else spec[tr.turn].response)
            while at < h and turn + 1 < len(spec):
                if turn == tr.turn and t.phase is Phase.tool:
                    seqs += 1
                obs = spec[turn].observation
                p += obs
                attend += obs * (before + obs / 2)
                at += self.cost.prefill_time(obs, before)
                before += obs + spec[turn + 1].response
                dtok += min(spec[turn + 1].response, max(h - at, 0.0) / tau)
                turns += 1
                turn += 1
                at += spec[turn].response * tau + spec[turn].latency_s
            if at < h and turn + 1 >= len(spec):  # its last step returns within the horizon: it ends
                ending += before
        return Demand(h, p, dtok, seqs, ctx / n if n else 0.0, turns=turns, live=n, mean_response=resp / n if n else 0.0,
                      observed=1 << 30,  # nothing to learn: it is the truth
                      prefill_arrivals=p - backlog, prefill_prefix=attend / p if p else 0.0, ending_context=ending,
                      **self.forecaster.recent.fields(now))  # measured, not forecast: the same either way

    def _check_drained(self, gpu: SimGPU) -> None:
        st = self.allocator.engines[gpu.id]
        if st.state is EngineState.draining and gpu.empty() and gpu.id not in self._flipping:
            self._flipping.add(gpu.id)
            self.loop.after(self.cost.switch_s, self._flipped, gpu.id)

    def _flipped(self, eid: str) -> None:
        """Drained, and the flip (graph capture) is done: the engine serves its new role."""
        self._flipping.discard(eid)
        if self.cost.flush_on_switch:
            self.gpus[eid].flush()
        self.allocator.drained(eid, self.loop.now)
        self.roles = self.allocator.roles()
        self._retry()

    def _retry(self) -> None:
        waiting, self.pending = self.pending, []
        for what, tid, eid in waiting:
            if what == "prefill":
                self._prefill(tid)
            else:
                self._to_decode(tid, eid)
