"""Engine roles from forecast demand: how many prefill, decode and mixed engines, and when to move.

`plan(demand)` scores whole layouts — p prefill, d decode and m mixed engines, every split of
the cluster (on a grid of at most `grid` steps a side) — by the seconds the cluster would need
to serve the forecast demand, with the **measured** `Capacity` (`scheduler.capacity`: a step
model fitted to the engines' own step timings):

    decode  : sequences spread over the d + m engines that decode; steps · step(batch, context),
              at the context arriving observations grow the conversations to over the least time
              a move binds the engines (`dwell_s`): the mean now plus half of what arrives per
              live trajectory, net of the conversations that end (in an async steady state, new
              short ones replace them). Priced at the mean now, a round of long tool observations
              made a split with few decode engines look 6-16% faster than the simulator ran it
              (12P4D over 10P6D for the MoE at 128 GPUs in `web`); priced over one 15-s horizon,
              3P1D 28% faster at the start of `shift`'s web-heavy round, which ran it 25% slower
              as the contexts grew 2.4x in the next 75 s
    prefill : the demand's prompt deltas, plus, on prefill engines, the last response when its
              KV is not pushed back from the decode engine (`response_kv_pushed`), plus full
              recompute for live contexts that do not fit in the KV of the engines holding them
              (those that prefill; every engine where KV moves between them: the prefill engine
              reads back what the decode engine kept)
    mixed   : its decode steps, plus what its share of prefill adds to them — per prefill token
              and per step that carries a chunk (the measured stall of a mixed step: on a
              data-parallel attention group one rank's chunk holds every rank)
    attends : a chunk's attention is priced at the demand's `prefill_prefix` — the context
              prefill tokens follow, weighted by tokens: the turns that prefill most are the long
              conversations, 2-5x the mean live context in the simulator's `shift` workload (priced
              at the mean, colocation scored within 3% of a one-prefill split in its first phase,
              where the simulated split ran 1.41x faster; priced at the prefix, 1.35x)
    layout  : the slowest kind; prefill is shared between prefill and mixed engines evenly per
              engine (the router's least-loaded pick does no better); and a split is no faster than
              its prefill engines' share of the backlog waiting now plus one response: a split
              pipelines a stream of turns, not a burst (a synchronous batch's first prompts)

`estimate="closed_loop"` (`AllocatorConfig.estimate`) prices a layout instead by the turn rate it
sustains: the live trajectories cycle through prefill, decode and their tool, so the turns a second
X solve live = X · (tool + L(X)) with the engines' latency of a turn L at that rate — queueing on
the prefill engines (ρ/(1 − ρ)), and a decode step running base / (1 − λu − the prefill share)
(a continuous batch stepping λ tokens a second, u seconds a sequence adds to a step) — from the
turns measured over the last two horizons (`Demand.turn_*`, `tool_s`), not the forecast: the
forecast sees only live trajectories. Where the engines wait on the tools more than on each other
(dense models) its error against the simulator's static splits is 2-3x smaller than the default's
(`benchmarks/pd_estimate.py`), on the DP-attention MoE about the same; but guided with it moved
where it lost, and found no split the default misses (`benchmarks/sim/README.md`): not the default.

Engines of several sizes (a per-role launch, `scheduler.launch`: prefill engines of one GPU for
decode engines of eight, say) are allocated too (`Allocator(sizes=..., capacities=...)`): each
engine keeps its size and moves between prefill and decode, and a layout is priced with every
engine at its own size's measured speed, the slowest size of a role setting that role's pace.

`allocate(demand, drain_s, now)` moves toward the best layout only when it pays:
- the gain (the share of throughput the new layout wins, held for `payback_s` or, when the
  current layout has been losing by `min_gain` for longer, for as long as it has — a burst is
  short, a phase is not — in engine-seconds) must beat the real cost of the move — each moved
  engine's drain time (or, where more, what the cluster loses while they drain: the engines
  left serve the demand, but for the draining engines' own decodes, in the layout the move
  leaves them, e.g. one mixed engine prefilling for all), the flip (`switch_s`: graph capture),
  and rebuilding the prefix caches an engine that stops prefilling strands — by `margin`, and be
  at least `min_gain` of the current estimate, in `confirm` decisions in a row;
- nothing moves in a round's tail, with fewer live trajectories than engines;
- any number of engines may move in one decision (`max_moves`, a share of the cluster: 1.0 by
  default) when the forecast says so; an engine that moved less than `dwell_s` ago stays, and
  nothing new moves while an engine is still draining (hysteresis: no flapping);
- moving means draining: the engine takes no new work, and `drained(id)` makes it ready in its
  new role once the caller sees it empty (and, in the simulator, flipped).

Non-goals: routing (`scheduler.router`), forecasting (`scheduler.forecast`), measuring
(`scheduler.capacity`), talking to engines.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from scheduler.capacity import Capacity
from scheduler.forecast import Demand
from scheduler.roles import EngineRole, EngineState, Role

__all__ = ["ESTIMATES", "Allocator", "AllocatorConfig", "Capacity", "Layout", "Move", "Sized"]

INF = float("inf")
ESTIMATES = ("throughput", "closed_loop")


@dataclass(slots=True, frozen=True)
class Layout:
    prefill: int
    decode: int
    mixed: int

    def count(self, role: Role) -> int:
        return {Role.prefill: self.prefill, Role.decode: self.decode, Role.mixed: self.mixed}[role]


# A layout of engines of several sizes: (size, its engines' layout) for each size, smallest first.
Sized = tuple[tuple[int, Layout], ...]


def _total(lay: Layout | Sized) -> Layout:
    if isinstance(lay, Layout):
        return lay
    return Layout(*(sum(x.count(r) for _, x in lay) for r in (Role.prefill, Role.decode, Role.mixed)))


def _count(lay: Layout | Sized, size: int, role: Role) -> int:
    """Engines of `size` in `role` (a `Layout`: of every engine; they are all one size)."""
    if isinstance(lay, Layout):
        return lay.count(role)
    return sum(x.count(role) for k, x in lay if k == size)


@dataclass(slots=True)
class AllocatorConfig:
    switch_s: float = 1.0  # flip cost beyond the drain: a routing change on kv_both vLLM; graph capture if re-launched
    margin: float = 0.25  # gain must beat cost by this fraction
    # ... and win at least this share of throughput: above the estimate's error against the
    # simulator (≈5-10% on dense models, where a split gains nothing), below the DP-attention gains
    min_gain: float = 0.10
    confirm: int = 2  # the same target must win this many decisions in a row (a burst is not a trend)...
    free_move: float = 20.0  # ... unless the gain is more than this many times the move's cost
    min_samples: int = 0  # engine steps the capacity fit must have seen before anything moves (0: trust the prior)
    # responses the forecaster must have learned from, as a share of the live trajectories, before
    # anything moves: the first responses to finish are the short ones, so an early forecast of
    # decode work is mostly its prior and biased low (0: act at once)
    min_observed: float = 0.0
    dwell_s: float = 30.0  # an engine keeps a new role at least this long
    max_moves: float = 1.0  # share of the cluster that may move per decision (at least one engine)
    payback_s: float = 60.0  # a new layout is credited with its gain over this long (RL phases last minutes)
    response_kv_pushed: bool = False  # the decode engine pushes the response KV back: no recompute on split turns
    grid: int = 16  # layouts searched: p and d in steps of max(1, n // grid), plus the current one
    # Roles are routing only (kv_both engines): a move to decode or mixed takes effect at once (in-
    # flight work finishes where it is); a move to prefill still drains the engine's decodes first,
    # or they would crawl at the prefill engine's step pace.
    routing_only: bool = False
    drain_idle: float = 0.5  # the share of a draining engine's time lost (its batch empties as sequences end)
    estimate: str = "throughput"  # or "closed_loop" (see the module docstring)


@dataclass(slots=True)
class Move:
    engine: str
    old: Role
    new: Role


class Allocator:
    """Holds every engine's role state; `allocate` decides moves, `drained` completes them."""

    def __init__(self, engine_ids: Iterable[str], capacity: Capacity | None = None,
                 config: AllocatorConfig | None = None, initial: Layout | None = None, now: float = 0.0,
                 prefill_capacity: Capacity | None = None, sizes: Mapping[str, int] | None = None,
                 capacities: Mapping[int, Capacity] | None = None):
        """`prefill_capacity`: the prefill engines' own step model, where they run at another size
        than the rest (a launch being scored: `scheduler.launch`); default `capacity`.
        `sizes` (each engine's GPUs) with `capacities` (each size's step model): a launch of
        engines of several sizes (per-role parallelism, `rollout launch-plan`). Roles then move
        within each size, never a size (that is a relaunch), and every layout is priced with each
        engine at its own size's speed (`estimate`); one size is the uniform allocator."""
        ids = sorted(engine_ids)
        self.capacity = capacity or Capacity()
        self.prefill_capacity = prefill_capacity
        self.sizes: dict[str, int] | None = None
        self.capacities: dict[int, Capacity] = {}
        if sizes is not None and len(set(sizes.values())) > 1:
            missing = set(ids) - set(sizes)
            if missing:
                raise ValueError(f"no size for engines {sorted(missing)}")
            self.sizes = {e: sizes[e] for e in ids}
            self.capacities = {k: (capacities or {}).get(k) or self.capacity for k in set(self.sizes.values())}
        self.config = config or AllocatorConfig()
        if self.config.estimate not in ESTIMATES:
            raise ValueError(f"unknown estimate {self.config.estimate!r}; one of {', '.join(ESTIMATES)}")
        self.engines: dict[str, EngineRole] = {e: EngineRole(e) for e in ids}
        initial = initial or Layout(0, 0, len(ids))
        roles = [Role.prefill] * initial.prefill + [Role.decode] * initial.decode
        roles += [Role.mixed] * (len(ids) - len(roles))
        for e, r in zip(ids, roles):
            self.engines[e].ready(now, r)
        self.history: list[tuple[float, Move]] = []
        self._pending: tuple[Layout | Sized, int] | None = None  # the winning layout and how many decisions in a row
        self._heading: Layout | Sized | None = None  # the target of a move made in two steps
        self._losing_since: float | None = None  # since when another layout has been clearly better

    # --- reading -----------------------------------------------------------------------
    def roles(self) -> dict[str, Role]:
        """Engines taking new work, with their role (what the router needs)."""
        return {e: s.role for e, s in self.engines.items() if s.state is EngineState.ready}

    def layout(self) -> Layout:
        """Where the cluster is heading: ready roles, and draining engines at their next role."""
        n = {r: 0 for r in Role}
        for s in self.engines.values():
            r = s.next_role if s.state is EngineState.draining else s.role
            if s.state is not EngineState.dead and r is not None:
                n[r] += 1
        return Layout(n[Role.prefill], n[Role.decode], n[Role.mixed])

    def draining(self) -> list[str]:
        return [e for e, s in self.engines.items() if s.state is EngineState.draining]

    def sized(self) -> Layout | Sized:
        """`layout()` by engine size where the engines are of several sizes."""
        if self.sizes is None:
            return self.layout()
        return self._layout_of([(self.sizes[e], s.next_role if s.state is EngineState.draining else s.role)
                                for e, s in self.engines.items() if s.state is not EngineState.dead])

    def _size(self, engine: str) -> int:
        return self.sizes[engine] if self.sizes is not None else 0

    def _layout_of(self, roles: list[tuple[int, Role | None]]) -> Layout | Sized:
        """The layout of (size, role) pairs: a `Sized` one where the engines are of several sizes."""
        if self.sizes is None:
            return Layout(*(sum(1 for _, r in roles if r is x) for x in (Role.prefill, Role.decode, Role.mixed)))
        return tuple((k, Layout(*(sum(1 for kk, r in roles if kk == k and r is x)
                                  for x in (Role.prefill, Role.decode, Role.mixed))))
                     for k in sorted(set(self.sizes.values())))

    # --- scoring -----------------------------------------------------------------------
    def estimate(self, lay: Layout | Sized, d: Demand) -> float:
        """Seconds the layout needs for the demand (see the module docstring). A `Sized` layout
        (engines of several sizes) is priced with every engine at its own size's speed: the router
        gives each engine of a role an even share whatever its size, so the slowest size in each
        role sets the pace, the max over each role's sizes (the throughput estimate only)."""
        if isinstance(lay, Layout):
            cap = self.capacity
            pcap = self.prefill_capacity or cap
            holders = lay.prefill + lay.decode + lay.mixed if self.config.response_kv_pushed else \
                lay.prefill + lay.mixed
            kv = lay.prefill * pcap.kv_tokens + (holders - lay.prefill) * cap.kv_tokens
            return self._estimate(lay, d, cap, cap, pcap, kv, closed_loop=True)
        caps = self.capacities
        total = _total(lay)
        pushed = self.config.response_kv_pushed
        kv = sum(caps[k].kv_tokens * (x.prefill + x.mixed + (x.decode if pushed else 0)) for k, x in lay)
        every = [k for k, _ in lay]
        decs = [k for k, x in lay if x.decode] or [k for k, x in lay if x.mixed] or every
        mixes = [k for k, x in lay if x.mixed] or decs
        pres = [k for k, x in lay if x.prefill] or every
        return max(self._estimate(total, d, caps[dk], caps[mk], caps[pk], kv)
                   for dk in decs for mk in mixes for pk in pres)

    def _estimate(self, lay: Layout, d: Demand, dcap: Capacity, mcap: Capacity, pcap: Capacity, kv: float,
                  closed_loop: bool = False) -> float:
        """`lay` with its decode engines at `dcap`, mixed at `mcap`, prefill at `pcap`; `kv`: the KV
        tokens of the engines a turn's prefill can start from (below)."""
        cap = dcap
        p, dec, m = lay.prefill, lay.decode, lay.mixed
        decoders, prefillers = dec + m, p + m
        if (d.decode_tokens > 0 and decoders == 0) or (d.prefill_tokens > 0 and prefillers == 0):
            return INF
        seqs = max(d.decode_seqs, 1.0)
        steps = d.decode_tokens / seqs
        # decode runs at the contexts arriving observations grow (net of the conversations that end)
        # over the least time a move binds the engines (`dwell_s`), on average half of that growth
        span = max(self.config.dwell_s / d.horizon_s, 1.0) if d.horizon_s > 0 else 1.0
        growth = span * max(d.prefill_arrivals - d.ending_context, 0.0) / d.live if d.live else 0.0
        ctx = max(d.mean_context, 1.0) + growth / 2
        b = seqs / decoders if decoders else 0.0

        def decoding(c: Capacity) -> tuple[float, float, float]:
            """(seconds, batch that fits its KV, waves) decoding an engine's share on engines of `c`."""
            fit = max(c.kv_tokens / ctx, 1.0)
            waves = max(1.0, b / fit)  # sequences beyond an engine's KV wait for a later wave
            return (waves * steps * c.step_s(min(b, fit), ctx) if d.decode_tokens > 0 else 0.0), fit, waves

        decode_s, fit, waves = decoding(cap)
        # the engines whose caches a turn's prefill can start from: those that prefill, or, where KV
        # moves between engines (`response_kv_pushed`), every engine: a prefill engine that evicted a
        # conversation reads it back from the engine that decoded it (its KV stays there, cached)
        holders = p + dec + m if self.config.response_kv_pushed else prefillers
        tokens = self.prefill_tokens(d, holders, split=False, kv=kv)
        extra = 0.0 if self.config.response_kv_pushed or not tokens else d.turns * d.mean_response / tokens
        # a turn's prefill attends to the conversation before it: the prefill-weighted context
        # (the turns that prefill most are the long conversations), or the mean one if unknown
        pfx = d.prefill_prefix or ctx
        rate = pcap.prefill_rate(pfx)

        def prefill_side(x: float) -> float:  # x tokens on the prefill engines
            return x * (1.0 + extra) / (p * rate) if p else 0.0

        m_decode_s, m_fit, m_waves = (decode_s, fit, waves) if mcap is cap else decoding(mcap)

        def mixed_side(y: float) -> float:  # y tokens on the mixed engines
            if not m:
                return 0.0
            per = y / m
            if per <= 0:
                return m_decode_s
            turns = d.turns * (y / tokens) / m
            n_steps = steps * m_waves if d.decode_tokens > 0 else 0.0
            # each turn's prefill rides at least one step; a step carries at most the budget
            chunk_steps = max(per / mcap.chunk_tokens, min(turns, n_steps), 1e-9)
            k = per / chunk_steps
            bb = min(b, m_fit)
            stall = mcap.step_s(bb, ctx, k, pfx) - mcap.step_s(bb, ctx, 0.0)
            return m_decode_s + chunk_steps * stall + max(chunk_steps - n_steps, 0.0) * mcap.step[0]

        if (closed_loop and self.config.estimate == "closed_loop" and d.turn_response > 0 and d.turn_prefill > 0
                and d.turns > 0 and d.live > 0):
            return self._closed_loop(lay, d, tokens, extra, pfx, ctx, fit, steps)
        # a split pipelines prefill and decode, but a turn waiting now decodes only once prefilled:
        # the last of the backlog starts decoding when the prefill engines are through it (a
        # burst: a synchronous batch's first prompts), so no split beats backlog + one response
        backlog = max(d.prefill_tokens - d.prefill_arrivals, 0.0)
        lag = steps * cap.step_s(min(b, fit), ctx) if d.decode_tokens > 0 else 0.0
        if not m:
            return max(prefill_side(tokens), decode_s, prefill_side(backlog) + lag)
        if not p:
            return mixed_side(tokens)
        # p prefill + m mixed: the router sends each new turn to the least-loaded engine that
        # prefills, and a mixed engine's load counts the KV it decodes from, so assume no better
        # than an even share per engine (a balanced split is not something the router can do)
        x = tokens * p / (p + m)
        worst = max(prefill_side(x), mixed_side(tokens - x), prefill_side(backlog * p / (p + m)) + lag)
        return max(worst, decode_s) if dec else worst

    def _closed_loop(self, lay: Layout, d: Demand, tokens: float, extra: float, pfx: float, ctx: float,
                     fit: float, steps: float) -> float:
        """Seconds the layout needs for the horizon's turns at the turn rate its closed loop sustains
        (see the module docstring), and no less than its backlog's prefill plus a horizon's decoding."""
        cap = self.capacity
        p, dec, m = lay.prefill, lay.decode, lay.mixed
        prefillers, decoders = p + m, dec + m
        base = max(cap.step[0], 1e-6)
        u = cap.step[1] + cap.step[2] * ctx  # what a sequence adds to a decode step
        resp = d.turn_response
        # a turn's prefill, with the recompute the estimate adds (conversations the KV cannot hold)
        tp = d.turn_prefill * (tokens / d.prefill_tokens if d.prefill_tokens > 0 else 1.0)
        pfx = d.turn_prefix or pfx
        c_p = (1.0 + extra) / max((self.prefill_capacity or cap).prefill_rate(pfx), 1e-9)  # seconds a token on a prefill engine
        k = min(cap.chunk_tokens, max(tp, 1.0))
        c_m = max(cap.step_s(1, ctx, k, pfx) - cap.step_s(1, ctx, 0.0), 0.0) / k  # ... beside decodes

        def latency(x: float) -> tuple[float, float]:
            """(seconds a turn waits for and takes to prefill, seconds a step of its decode) at x turns/s."""
            per = x / prefillers if prefillers else 0.0  # turns a second an engine that prefills takes
            lam = x * resp / decoders if decoders else 0.0  # tokens a second an engine that decodes makes
            wait = step = 0.0
            if p:
                rho = per * tp * c_p
                if rho >= 1.0:
                    return INF, INF
                wait += p * tp * c_p / (1.0 - rho)
            for n, busy in ((m, per * tp * c_m), (dec, 0.0)):
                if not n:
                    continue
                free = 1.0 - busy - lam * u
                if free <= 0.0 or lam * base / free > fit:  # saturated, or a batch beyond the KV
                    return INF, INF
                step += n * base / free
                if busy:
                    wait += n * tp * c_m / free
            return wait / prefillers if prefillers else 0.0, step / decoders if decoders else 0.0

        lo, hi = 0.0, d.live / max(d.tool_s, 1e-3)  # no faster than every trajectory in its tool alone
        for _ in range(40):
            x = (lo + hi) / 2
            wait, step = latency(x)
            if x * (d.tool_s + wait + resp * step) < d.live:
                lo = x
            else:
                hi = x
        if lo <= 0:
            return INF
        # a turn waiting now decodes only once prefilled: the backlog (a synchronous batch's first
        # prompts) goes through the engines that prefill before its last turn decodes a horizon's worth
        backlog = max(d.prefill_tokens - d.prefill_arrivals, 0.0)
        speed = (p / c_p if p else 0.0) + (m / c_m if m and c_m > 0 else 0.0)
        burst = (backlog / speed if speed > 0 else 0.0) + steps * latency(lo)[1]
        return max(d.turns / lo, burst)

    def prefill_tokens(self, d: Demand, holders: int, split: bool, kv: float | None = None) -> float:
        """Prefill the engines will really do: the forecast deltas, plus, on a prefill engine,
        the last response it never saw (`split`, unless its KV is pushed back), plus full
        recompute for the share of live contexts that cannot stay cached on the `holders`
        engines' KV (`kv` tokens in all; default: `holders` engines of `capacity`'s)."""
        need = d.live * d.mean_context
        # turns come back to the same engines in a cycle, so an LRU prefix cache that cannot hold
        # them all loses nearly every one (a cliff, not a slope): miss rises from 0 at 90% full to
        # 1 at 110% (the simulator's cache evicts down to 90%)
        kv = holders * self.capacity.kv_tokens if kv is None else kv
        fill = need / kv if holders and kv > 0 and need > 0 else 0.0
        miss = min(max((fill - 0.9) / 0.2, 0.0), 1.0)
        extra = d.turns * d.mean_response if split and not self.config.response_kv_pushed else 0.0
        return d.prefill_tokens + extra + d.turns * miss * d.mean_context

    def candidates(self, n: int, include: Layout | None = None) -> list[Layout]:
        """Whole layouts: p prefill, d decode, the rest mixed, on a grid (and `include`)."""
        g = max(1, n // max(self.config.grid, 1))
        counts = sorted(set(range(0, n + 1, g)) | {n})
        out = {Layout(p, dd, n - p - dd) for p in counts for dd in counts if p + dd <= n}
        if include is not None:
            out.add(include)
        return sorted(out, key=lambda lay: (lay.prefill, lay.decode))

    def targets(self) -> list[Layout] | list[Sized]:
        """The layouts a move may head for: `candidates` of the live engines, or, where they are of
        several sizes, every combination of each size's prefill/decode splits. No mixed engine there:
        the router leaves a mixed engine the decodes of what it prefilled (`RoleAware.pick_decode`) until
        it is far busier than the decode engines, not the even share `estimate` prices, and beside
        engines of another size that error picked layouts that ran up to 1.8x slower in the simulator
        (the 32B, 4 prefill engines of TP1 and one decode engine of TP4, in `math`)."""
        alive = [e for e, s in self.engines.items() if s.state is not EngineState.dead]
        if self.sizes is None:
            return self.candidates(len(alive))
        counts = {k: sum(1 for e in alive if self.sizes[e] == k) for k in sorted(set(self.sizes.values()))}
        per = [[(k, lay) for lay in self.candidates(n) if not lay.mixed] for k, n in counts.items()]
        return [tuple(combo) for combo in itertools.product(*per)]

    def plan(self, d: Demand) -> tuple[Layout | Sized, float]:
        n = sum(1 for s in self.engines.values() if s.state is not EngineState.dead)
        return min(((lay, self.estimate(lay, d)) for lay in self.targets()),
                   key=lambda x: (x[1], _total(x[0]).mixed != n, _total(x[0]).prefill))

    # --- deciding ----------------------------------------------------------------------
    def allocate(self, d: Demand, drain_s: Mapping[str, float], now: float,
                 cached: Mapping[str, float] | None = None) -> list[Move]:
        """Start the moves worth making now. `drain_s`: each engine's time to finish what it holds;
        `cached`: the conversation tokens each engine's prefix cache holds (a move from a role that
        prefills to one that does not strands them: the prefill engines rebuild them, a cost)."""
        cfg = self.config
        samples = min(c.samples for c in self.capacities.values()) if self.sizes else self.capacity.samples
        if self.draining() or samples < cfg.min_samples or d.observed < cfg.min_observed * d.live:
            return []
        cur = self.sized()
        tot = _total(cur)
        n = tot.prefill + tot.decode + tot.mixed
        if 0 < d.live < n:
            # a round's tail: at most one trajectory an engine, so colocation has no interference to
            # take away, and a split moved to for it greets the next round's burst (Llama-3-8B `web`
            # sync at 8 GPUs: moved to a split for the last trajectory, the next round ran 19% slower)
            self._pending = None
            return []
        cur_s = self.estimate(cur, d)
        # how long the current layout has been losing: a demand that has favoured another layout
        # for t seconds is credited with holding about t more (a burst is short, a phase is not)
        _, plan_s = self.plan(d)
        if plan_s < cur_s * (1.0 - cfg.min_gain):
            self._losing_since = now if self._losing_since is None else self._losing_since
        else:
            self._losing_since = None
        payback = max(cfg.payback_s, now - self._losing_since) if self._losing_since is not None else cfg.payback_s
        budget = max(1, int(cfg.max_moves * n))
        movable = [(drain_s.get(e, 0.0), e, s.role) for e, s in self.engines.items()
                   if s.state is EngineState.ready and now - s.since >= cfg.dwell_s]
        sizes = sorted(set(self.sizes.values())) if self.sizes else [0]
        pools = {(k, r): sorted((c, e) for c, e, role in movable if role is r and self._size(e) == k)
                 for k in sizes for r in Role}
        best: tuple[float, list[Move], Layout | Sized, int, bool] | None = None
        for lay in self.targets():
            # each size's engines move among that size's roles: what one gives, the same size takes
            surplus = {(k, r): _count(cur, k, r) - _count(lay, k, r) for k in sizes for r in Role}
            n_moves = sum(v for v in surplus.values() if v > 0)
            if n_moves == 0 or any(len(pools[kr]) < v for kr, v in surplus.items()):
                continue
            new_s = self.estimate(lay, d)
            if new_s == INF or new_s >= cur_s:
                continue
            gives = [(c, e, r) for k in sizes for r in Role if surplus[k, r] > 0 for c, e in pools[k, r][: surplus[k, r]]]
            wants = [r for k in sizes for r in Role for _ in range(max(-surplus[k, r], 0))]
            drains = [not cfg.routing_only or new is Role.prefill for new in wants]
            now_moves = [True] * len(gives)
            if not self._serves(gives, wants, drains, now_moves):
                # toward the layout in steps: engines bound for prefill first, then as many of the rest
                # as keep every kind of work served; the next decisions finish the move (`_heading`)
                order = sorted(range(len(gives)), key=lambda i: (wants[i] is not Role.prefill, gives[i][0]))
                now_moves = [False] * len(gives)
                for i in order:
                    now_moves[i] = True
                    if not self._serves(gives, wants, drains, now_moves):
                        now_moves[i] = False
                if not any(now_moves):
                    continue
            if sum(now_moves) > budget:  # toward the layout, `budget` engines at a time
                order = sorted((i for i, g in enumerate(now_moves) if g),
                               key=lambda i: (wants[i] is not Role.prefill, gives[i][0]))
                now_moves = [False] * len(gives)
                for i in order[:budget]:
                    now_moves[i] = True
                if not self._serves(gives, wants, drains, now_moves):
                    continue
            # engine-seconds lost to draining and flipping, and to rebuilding stranded prefix caches
            # a draining engine keeps decoding what it holds: its batch empties as the sequences
            # end, so on average about half its slots stand idle while it drains
            cost = sum((cfg.drain_idle * c if dr else 0.0) + cfg.switch_s for (c, _, _), dr in zip(gives, drains))
            cost = max(cost, self._transition(cur_s, d, gives, wants, drains, now_moves) + cfg.switch_s * len(gives))
            if cached:
                cost += sum(cached.get(e, 0.0) / self._capacity(e).prefill_rate(d.mean_context)
                            for (_, e, old), new in zip(gives, wants) if old.prefills and not new.prefills)
            share = 1.0 - new_s / cur_s if cur_s < INF else 1.0  # throughput share the new layout wins
            gain = share * n * payback  # engine-seconds won over the payback window
            if gain > (1.0 + cfg.margin) * cost and share >= cfg.min_gain:
                net = gain - cost
                if best is None or net > best[0]:
                    best = (net, [Move(e, old, new) for (_, e, old), new, go in zip(gives, wants, now_moves) if go],
                            lay, len(gives), gain > cfg.free_move * cost)  # [4]: nearly free
        if best is None:
            self._pending = None
            return []
        target = best[2]  # the layout, not which engines: those follow drain times, which change
        self._pending = (target, self._pending[1] + 1 if self._pending and self._pending[0] == target else 1)
        # confirming guards against paying for a move a passing burst asked for; a move that costs
        # next to nothing (its engines hold next to nothing: a new batch on an idle cluster) is made at once
        if self._pending[1] < cfg.confirm and best[2] != self._heading and not best[4]:
            return []
        self._pending = None
        self._heading = best[2] if len(best[1]) < best[3] else None  # a two-step move: its second step needs no confirming
        for m in best[1]:
            self.engines[m.engine].drain(m.new, now)
            if cfg.routing_only and m.new is not Role.prefill:
                self.engines[m.engine].ready(now)  # nothing to drain: routing changes at once
            self.history.append((now, m))
        return best[1]

    def _transition(self, cur_s: float, d: Demand, gives: list, wants: list[Role], drains: list[bool],
                    go: list[bool]) -> float:
        """Engine-seconds a move loses while its engines drain: they take nothing new, so for the
        mean drain the rest serve the demand alone (all of it but the decodes the draining engines
        hold), in the layout they are left in (a move that leaves one mixed engine to prefill for
        the cluster costs the cluster, not only the drained engines' idle slots), less the work the
        draining engines still finish. Charged for the longest drain with every decode on the
        engines left, the MoE at 128 GPUs never left colocation in `shift` (0.69x of the best split)."""
        draining = [(c, e) for (c, e, _), dr, g in zip(gives, drains, go) if dr and g]
        if not draining or cur_s == INF:
            return 0.0
        inter = self._layout_of(self._left(gives, wants, drains, go))
        n = sum(1 for s in self.engines.values() if s.state is not EngineState.dead)
        # the draining engines decode what they hold themselves (about their share of the sequences):
        # the engines left carry the rest; and they come back one by one, after the mean drain
        keep = 1.0 - len(draining) / n
        d = replace(d, decode_tokens=d.decode_tokens * keep, decode_seqs=d.decode_seqs * keep)
        t = sum(c for c, _ in draining) / len(draining)
        lost = t * n * max(1.0 - cur_s / self.estimate(inter, d), 0.0)
        return lost - sum((1.0 - self.config.drain_idle) * c for c, _ in draining)

    def _serves(self, gives: list, wants: list[Role], drains: list[bool], go: list[bool]) -> bool:
        """While the moved engines drain, some engine left must still prefill and one decode."""
        left = self._left(gives, wants, drains, go)
        return any(r.prefills for _, r in left) and any(r.decodes for _, r in left)

    def _left(self, gives: list, wants: list[Role], drains: list[bool], go: list[bool]) -> list[tuple[int, Role]]:
        """The (size, role) of each engine serving while a move's engines drain: ready engines it
        does not move, and the moved engines that take their new role at once (no drain)."""
        moving = {e for (_, e, _), g in zip(gives, go) if g}
        left = [(self._size(e), s.role) for e, s in self.engines.items()
                if s.state is EngineState.ready and e not in moving]
        return left + [(self._size(e), new) for (_, e, _), new, dr, g in zip(gives, wants, drains, go) if g and not dr]

    def _capacity(self, engine: str) -> Capacity:
        return self.capacities[self.sizes[engine]] if self.sizes is not None else self.capacity

    def drained(self, engine_id: str, now: float) -> Role:
        """The engine holds nothing any more: it starts serving its new role."""
        s = self.engines[engine_id]
        s.ready(now)
        return s.role

    def remove(self, engine_id: str, now: float) -> None:
        self.engines[engine_id].die(now)

