"""Engine roles from forecast demand: how many prefill, decode and mixed engines, and when to move.

`plan(demand)` scores whole layouts — p prefill, d decode and m mixed engines, every split of
the cluster (on a grid of at most `grid` steps a side) — by the seconds the cluster would need
to serve the forecast demand, with the **measured** `Capacity` (`scheduler.capacity`: a step
model fitted to the engines' own step timings):

    decode  : sequences spread over the d + m engines that decode; steps · step(batch, context)
    prefill : the demand's prompt deltas, plus, on prefill engines, the last response when its
              KV is not pushed back from the decode engine (`response_kv_pushed`), plus full
              recompute for live contexts that do not fit in the KV of the engines holding them
    mixed   : its decode steps, plus what its share of prefill adds to them — per prefill token
              and per step that carries a chunk (the measured stall of a mixed step: on a
              data-parallel attention group one rank's chunk holds every rank)
    layout  : the slowest kind; prefill is shared between prefill and mixed engines so that both
              finish together

`allocate(demand, drain_s, now)` moves toward the best layout only when it pays:
- the gain (the share of throughput the new layout wins, held for `payback_s`, in engine-
  seconds) must beat the real cost of the move — each moved engine's drain time plus the flip
  (`switch_s`: graph capture and a flushed prefix cache) — by `margin`, and be at least
  `min_gain` of the current estimate;
- any number of engines may move in one decision (`max_moves`, a share of the cluster: 1.0 by
  default) when the forecast says so; an engine that moved less than `dwell_s` ago stays, and
  nothing new moves while an engine is still draining (hysteresis: no flapping);
- moving means draining: the engine takes no new work, and `drained(id)` makes it ready in its
  new role once the caller sees it empty (and, in the simulator, flipped).

Non-goals: routing (`scheduler.router`), forecasting (`scheduler.forecast`), measuring
(`scheduler.capacity`), talking to engines.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scheduler.capacity import Capacity
from scheduler.forecast import Demand
from scheduler.roles import EngineRole, EngineState, Role

__all__ = ["Allocator", "AllocatorConfig", "Capacity", "Layout", "Move"]

INF = float("inf")


@dataclass(slots=True, frozen=True)
class Layout:
    prefill: int
    decode: int
    mixed: int

    def count(self, role: Role) -> int:
        return {Role.prefill: self.prefill, Role.decode: self.decode, Role.mixed: self.mixed}[role]


@dataclass(slots=True)
class AllocatorConfig:
    switch_s: float = 1.0  # flip cost beyond the drain: a routing change on kv_both vLLM; graph capture if re-launched
    margin: float = 0.25  # gain must beat cost by this fraction
    min_gain: float = 0.05  # ... and be at least this share of the current estimate
    dwell_s: float = 30.0  # an engine keeps a new role at least this long
    max_moves: float = 1.0  # share of the cluster that may move per decision (at least one engine)
    payback_s: float = 60.0  # a new layout is credited with its gain over this long (RL phases last minutes)
    response_kv_pushed: bool = False  # the decode engine pushes the response KV back: no recompute on split turns
    grid: int = 16  # layouts searched: p and d in steps of max(1, n // grid), plus the current one


@dataclass(slots=True)
class Move:
    engine: str
    old: Role
    new: Role


class Allocator:
    """Holds every engine's role state; `allocate` decides moves, `drained` completes them."""

    def __init__(self, engine_ids: Iterable[str], capacity: Capacity | None = None,
                 config: AllocatorConfig | None = None, initial: Layout | None = None, now: float = 0.0):
        ids = sorted(engine_ids)
        self.capacity = capacity or Capacity()
        self.config = config or AllocatorConfig()
        self.engines: dict[str, EngineRole] = {e: EngineRole(e) for e in ids}
        initial = initial or Layout(0, 0, len(ids))
        roles = [Role.prefill] * initial.prefill + [Role.decode] * initial.decode
        roles += [Role.mixed] * (len(ids) - len(roles))
        for e, r in zip(ids, roles):
            self.engines[e].ready(now, r)
        self.history: list[tuple[float, Move]] = []

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

    # --- scoring -----------------------------------------------------------------------
    def estimate(self, lay: Layout, d: Demand) -> float:
        """Seconds the layout needs for the demand (see the module docstring)."""
        cap = self.capacity
        p, dec, m = lay.prefill, lay.decode, lay.mixed
        decoders, prefillers = dec + m, p + m
        if (d.decode_tokens > 0 and decoders == 0) or (d.prefill_tokens > 0 and prefillers == 0):
            return INF
        seqs = max(d.decode_seqs, 1.0)
        steps = d.decode_tokens / seqs
        ctx = max(d.mean_context, 1.0)
        fit = max(cap.kv_tokens / ctx, 1.0)
        b = seqs / decoders if decoders else 0.0
        waves = max(1.0, b / fit)  # sequences beyond an engine's KV wait for a later wave
        decode_s = waves * steps * cap.step_s(min(b, fit), ctx) if d.decode_tokens > 0 else 0.0
        tokens = self.prefill_tokens(d, prefillers, split=False)
        extra = 0.0 if self.config.response_kv_pushed or not tokens else d.turns * d.mean_response / tokens
        rate = cap.prefill_rate()

        def prefill_side(x: float) -> float:  # x tokens on the prefill engines
            return x * (1.0 + extra) / (p * rate) if p else 0.0

        def mixed_side(y: float) -> float:  # y tokens on the mixed engines
            if not m:
                return 0.0
            per = y / m
            turns = d.turns * (y / tokens if tokens else 0.0) / m
            n_steps = steps * waves if d.decode_tokens > 0 else 0.0
            chunk_steps = max(per / cap.chunk_tokens, min(turns, n_steps)) if per > 0 else 0.0
            base, _, _, per_tok, per_chunk_step = cap.step
            return (decode_s + chunk_steps * per_chunk_step + per_tok * per
                    + max(chunk_steps - n_steps, 0.0) * base)

        if not m:
            return max(prefill_side(tokens), decode_s)
        if not p:
            return mixed_side(tokens)
        lo, hi = 0.0, tokens  # prefill side grows with x, mixed side shrinks: meet in the middle
        for _ in range(24):
            x = 0.5 * (lo + hi)
            if prefill_side(x) < mixed_side(tokens - x):
                lo = x
            else:
                hi = x
        x = 0.5 * (lo + hi)
        worst = max(prefill_side(x), mixed_side(tokens - x))
        return max(worst, decode_s) if dec else worst

    def prefill_tokens(self, d: Demand, holders: int, split: bool) -> float:
        """Prefill the engines will really do: the forecast deltas, plus, on a prefill engine,
        the last response it never saw (`split`, unless its KV is pushed back), plus full
        recompute for the share of live contexts that cannot stay cached on the `holders`
        engines' KV."""
        need = d.live * d.mean_context
        miss = max(0.0, 1.0 - holders * self.capacity.kv_tokens / need) if need > 0 else 0.0
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

    def plan(self, d: Demand) -> tuple[Layout, float]:
        n = sum(1 for s in self.engines.values() if s.state is not EngineState.dead)
        return min(((lay, self.estimate(lay, d)) for lay in self.candidates(n)),
                   key=lambda x: (x[1], x[0].mixed != n, x[0].prefill))

    # --- deciding ----------------------------------------------------------------------
    def allocate(self, d: Demand, drain_s: Mapping[str, float], now: float) -> list[Move]:
        """Start the moves worth making now. `drain_s`: each engine's time to finish what it holds."""
        if self.draining():
            return []
        cfg = self.config
        cur = self.layout()
        cur_s = self.estimate(cur, d)
        n = cur.prefill + cur.decode + cur.mixed
        budget = max(1, int(cfg.max_moves * n))
        movable = [(drain_s.get(e, 0.0), e, s.role) for e, s in self.engines.items()
                   if s.state is EngineState.ready and now - s.since >= cfg.dwell_s]
        pools = {r: sorted((c, e) for c, e, role in movable if role is r) for r in Role}
        best: tuple[float, list[Move]] | None = None
        for lay in self.candidates(n):
            surplus = {r: cur.count(r) - lay.count(r) for r in Role}
            n_moves = sum(v for v in surplus.values() if v > 0)
            if n_moves == 0 or n_moves > budget or any(len(pools[r]) < v for r, v in surplus.items()):
                continue
            new_s = self.estimate(lay, d)
            if new_s == INF or new_s >= cur_s:
                continue
            gives = [(c, e, r) for r in Role if surplus[r] > 0 for c, e in pools[r][: surplus[r]]]
            if not self._keeps_serving({e for _, e, _ in gives}):
                continue
            cost = sum(c + cfg.switch_s for c, _, _ in gives)  # engine-seconds lost to draining and flipping
            share = 1.0 - new_s / cur_s if cur_s < INF else 1.0  # throughput share the new layout wins
            gain = share * n * cfg.payback_s  # engine-seconds won over the payback window
            if gain > (1.0 + cfg.margin) * cost and share >= cfg.min_gain:
                net = gain - cost
                if best is None or net > best[0]:
                    wants = [r for r in Role for _ in range(max(-surplus[r], 0))]
                    best = (net, [Move(e, old, new) for (_, e, old), new in zip(gives, wants)])
        if best is None:
            return []
        for m in best[1]:
            self.engines[m.engine].drain(m.new, now)
            self.history.append((now, m))
        return best[1]

    def _keeps_serving(self, moving: set[str]) -> bool:
        """While the moved engines drain, some ready engine must still prefill and one decode."""
        left = [s.role for e, s in self.engines.items() if s.state is EngineState.ready and e not in moving]
        return any(r.prefills for r in left) and any(r.decodes for r in left)

    def drained(self, engine_id: str, now: float) -> Role:
        """The engine holds nothing any more: it starts serving its new role."""
        s = self.engines[engine_id]
        s.ready(now)
        return s.role

    def remove(self, engine_id: str, now: float) -> None:
        self.engines[engine_id].die(now)

