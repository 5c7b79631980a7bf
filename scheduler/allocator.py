"""Engine roles from forecast demand: how many prefill, decode and mixed engines, and when to move.

`plan(demand)` scores layouts by the time the cluster would take to serve the forecast
demand, with the measured `Capacity`:

    prefill s  = prefill tokens / (prefill engines · prefill tok/s), where prefill tokens add
                 what multi-turn disaggregation costs: a prefill engine recomputes the last
                 response (it never saw it), and contexts that do not fit in the KV of the
                 engines holding them are recomputed in full
    decode s   = steps · step(batch per decode engine)   (steps = decode tokens / sequences;
                 sequences beyond an engine's KV capacity wait for a later wave)
    split      : max(prefill s, decode s)                 the two halves run side by side
    all mixed  : steps · step(batch / N) + interference · prefill tokens / N
    p + mixed  : prefill shared between p prefill engines and the mixed ones, balanced

`interference` is the measured stall a prefill token adds to a colocated decode step (fitted
from observed steps, not assumed). Layouts searched: all mixed, p prefill + rest decode,
p prefill + rest mixed.

`allocate(demand, drain_s, now)` moves toward the best layout only when worth it:
- the forecast gain (seconds saved over the horizon) must exceed the drain-and-switch cost
  (each moved engine's drain time plus `switch_s`, as a share of the cluster) by `margin`,
  and be at least `min_gain` of the current estimate;
- at most `max_moves` engines move per decision; an engine that moved less than `dwell_s`
  ago stays; nothing new moves while an engine is still draining (hysteresis: no flapping);
- moving means draining: the engine takes no new work, and `drained(id)` makes it ready in
  its new role once the caller sees it empty.

Non-goals: routing (`scheduler.router`), forecasting (`scheduler.forecast`), talking to engines.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from scheduler.forecast import Demand
from scheduler.roles import EngineRole, EngineState, Role

INF = float("inf")


@dataclass(slots=True)
class Capacity:
    """Measured engine speed, starting from a prior and refined by observations.

    Decode step seconds ≈ base + per_seq·B + per_ctx·C + interference·K for a step running
    B sequences holding C context tokens alongside K prefill tokens (colocated chunk). Fitted
    by ridge regression toward the prior, so a few odd samples cannot swing it.
    """

    prefill_tok_s: float = 20_000.0
    step: list = field(default_factory=lambda: [0.010, 1e-4, 4e-8, 5e-5])  # base, per_seq, per_ctx, interf.
    kv_tokens: float = 400_000.0
    ridge: float = 50.0  # weight of the prior, in pseudo-samples
    _xtx: list = field(default_factory=list)
    _xty: list = field(default_factory=list)
    _prior: list = field(default_factory=list)
    _n: int = 0

    def __post_init__(self) -> None:
        self._prior = list(self.step)
        self._xtx = [[0.0] * 4 for _ in range(4)]
        self._xty = [0.0] * 4

    def step_s(self, batch: float, ctx_per_seq: float, prefill_tokens: float = 0.0) -> float:
        b, s, c, i = self.step
        return b + s * batch + c * batch * ctx_per_seq + i * prefill_tokens

    def observe_prefill(self, tokens: float, seconds: float) -> None:
        if seconds > 0 and tokens > 0:
            self.prefill_tok_s += 0.05 * (tokens / seconds - self.prefill_tok_s)

    def observe_step(self, batch: float, ctx_tokens: float, prefill_tokens: float, seconds: float) -> None:
        # Features scaled to similar magnitude so the ridge treats them alike.
        x = (1.0, batch / 100.0, ctx_tokens / 1e5, prefill_tokens / 1e3)
        for r in range(4):
            self._xty[r] += x[r] * seconds
            for c in range(4):
                self._xtx[r][c] += x[r] * x[c]
        self._n += 1
        if self._n % 64 == 0:
            self._refit()

    def _refit(self) -> None:
        scale = (1.0, 100.0, 1e5, 1e3)
        a = [[self._xtx[r][c] + (self.ridge if r == c else 0.0) for c in range(4)] for r in range(4)]
        y = [self._xty[r] + self.ridge * self._prior[r] * scale[r] for r in range(4)]
        theta = _solve(a, y)
        if theta is not None:
            self.step = [max(t / s, 0.0) for t, s in zip(theta, scale)]


def _solve(a: list[list[float]], y: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting (4x4: not worth a dependency)."""
    n = len(y)
    m = [row[:] + [y[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) < 1e-12:
            return None
        m[col], m[piv] = m[piv], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= f * m[col][c]
    out = [0.0] * n
    for r in range(n - 1, -1, -1):
        out[r] = (m[r][n] - sum(m[r][c] * out[c] for c in range(r + 1, n))) / m[r][r]
    return out


@dataclass(slots=True, frozen=True)
class Layout:
    prefill: int
    decode: int
    mixed: int

    def count(self, role: Role) -> int:
        return {Role.prefill: self.prefill, Role.decode: self.decode, Role.mixed: self.mixed}[role]


@dataclass(slots=True)
class AllocatorConfig:
    switch_s: float = 1.0  # fixed cost of a switch beyond the drain (a routing change on kv_both vLLM)
    margin: float = 0.25  # gain must beat cost by this fraction
    min_gain: float = 0.05  # ... and be at least this share of the current estimate
    dwell_s: float = 30.0  # an engine keeps a new role at least this long
    max_moves: float = 0.25  # share of the cluster that may move per decision (at least one engine)


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
        seqs = max(d.decode_seqs, 1.0)
        steps = d.decode_tokens / seqs
        ctx = max(d.mean_context, 1.0)

        def decode_s(n: int, prefill_tokens: float = 0.0) -> float:
            if d.decode_tokens <= 0:
                return 0.0
            if n == 0:
                return INF
            b = seqs / n
            fit = max(cap.kv_tokens / ctx, 1.0)
            waves = max(1.0, b / fit)
            return waves * steps * cap.step_s(min(b, fit), ctx) + cap.step[3] * prefill_tokens / n

        if lay.prefill == 0:
            if lay.mixed == 0:
                return INF if d.prefill_tokens > 0 else decode_s(lay.decode)
            return decode_s(lay.mixed, self.prefill_tokens(d, lay.mixed, split=False))
        tokens = self.prefill_tokens(d, lay.prefill + lay.mixed, split=True)
        if lay.mixed == 0:
            return max(tokens / (lay.prefill * cap.prefill_tok_s), decode_s(lay.decode))
        if lay.decode == 0:  # p prefill + m mixed: shift prefill to where it finishes soonest
            base = decode_s(lay.mixed)
            per_tok = cap.step[3] / lay.mixed  # seconds a mixed engine loses per prefill token
            x = (base + per_tok * tokens) / (1.0 / (lay.prefill * cap.prefill_tok_s) + per_tok)
            x = min(max(x, 0.0), tokens)
            return max(x / (lay.prefill * cap.prefill_tok_s), base + per_tok * (tokens - x))
        return INF  # prefill + decode + mixed: not searched

    def prefill_tokens(self, d: Demand, holders: int, split: bool) -> float:
        """Prefill the engines will really do: the forecast deltas, plus, on a prefill engine,
        the last response it never saw, plus full recompute for the share of live contexts
        that cannot stay cached on the `holders` engines' KV."""
        need = d.live * d.mean_context
        miss = max(0.0, 1.0 - holders * self.capacity.kv_tokens / need) if need > 0 else 0.0
        extra = d.turns * d.mean_response if split else 0.0
        return d.prefill_tokens + extra + d.turns * miss * d.mean_context

    def candidates(self, n: int) -> list[Layout]:
        out = [Layout(0, 0, n)]
        for p in range(1, n):
            out += [Layout(p, n - p, 0), Layout(p, 0, n - p)]
        return out

    def plan(self, d: Demand) -> tuple[Layout, float]:
        n = sum(1 for s in self.engines.values() if s.state is not EngineState.dead)
        return min(((lay, self.estimate(lay, d)) for lay in self.candidates(n)),
                   key=lambda x: (x[1], x[0].mixed == 0, x[0].prefill))

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
            gives = [(c, e, r) for r in Role if surplus[r] > 0 for c, e in pools[r][: surplus[r]]]
            if not self._keeps_serving({e for _, e, _ in gives}):
                continue
            cost = sum(c + cfg.switch_s for c, _, _ in gives) / n
            gain = cur_s - self.estimate(lay, d)
            if gain == INF:
                gain = 1e9  # anything beats a layout that cannot serve the demand
            if gain > (1.0 + cfg.margin) * cost and gain >= cfg.min_gain * min(cur_s, 1e9):
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

