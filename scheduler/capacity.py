"""How fast the engines are, as measured: a linear step model fitted to observed engine steps.

    step seconds ≈ base + per_seq·B + per_ctx·C + per_rank_tok·min(K, rank_tokens)
                   + per_chunk_step·[K > 0] + per_tok·K + per_prefix·min(K, rank_tokens)·P

for a step running B decoding sequences that hold C context tokens in all, beside K prefill
tokens after P cached ones (a later turn's prefill attends to the whole conversation: at 30k
tokens of prefix a 2,048-token chunk costs ~0.15 s on an H200 rank). On a data-parallel attention group one rank takes at most `rank_tokens` of the chunk
and every rank waits for it at the barrier, so the first `rank_tokens` cost far more than the
rest (which other ranks take in parallel): measured-shape cost, 8B dense, is linear in K; a
DP8 MoE group's step grows 23 ms over the first 2,048 tokens and 11 ms over the next 14k.
`per_chunk_step` is what a step pays for carrying any prefill at all. A prefill-only engine's
rate follows from the same fit at the engine's step budget (`chunk_tokens`, vLLM's
`max_num_batched_tokens` times the DP ranks: configuration, not speed)

Whoever sees steps calls `observe_step`: the simulator for every simulated engine step, the
live service from vLLM's per-step timings. The fit is least squares in relative error (each
step weighs 1/seconds²), with a ridge toward the prior: `ridge` pseudo-samples of a one-second
step, so light that it only holds the terms no sample has exercised yet (no chunk seen: the
prior's chunk costs) and never bends what the samples say (a stronger pull toward a vague
prior left a DP8 MoE group's fitted decode step 10x off).

    cap = Capacity(chunk_tokens=2048)
    cap.observe_step(batch=64, ctx_tokens=131_072, prefill_tokens=512, seconds=0.031)
    cap.step_s(64, 2048, 512), cap.prefill_rate()

Non-goals: choosing roles (`scheduler.allocator`), reading metrics (the caller feeds it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

FEATURES = 7
_SCALE = (1.0, 100.0, 1e5, 1e3, 1.0, 1e3, 1e8)  # features scaled to similar magnitude so the ridge treats them alike


@dataclass(slots=True)
class Capacity:
    """Measured engine speed, starting from a prior and refined by observations."""

    prefill_tok_s: float | None = None  # a prior for the prefill rate until a chunk is seen; None: from `step`
    step: list = field(default_factory=lambda: [0.010, 1e-4, 4e-8, 5e-5, 0.0, 0.0, 0.0])
    kv_tokens: float = 400_000.0
    chunk_tokens: int = 2048  # the engine's per-step prefill budget (vLLM max_num_batched_tokens)
    rank_tokens: int = 0  # one DP rank's share of it; 0: the whole budget (no DP attention)
    ridge: float = 50.0  # weight of the prior, in pseudo-samples
    refit_every: int = 64
    _xtx: list = field(default_factory=list)
    _xty: list = field(default_factory=list)
    _prior: list = field(default_factory=list)
    _n: int = 0
    _chunks: int = 0  # observed steps that carried prefill

    def __post_init__(self) -> None:
        self.step = (list(self.step) + [0.0] * FEATURES)[:FEATURES]  # a 4-term prior: the rest cost nothing
        self.rank_tokens = self.rank_tokens or self.chunk_tokens
        self._prior = list(self.step)
        self._xtx = [[0.0] * FEATURES for _ in range(FEATURES)]
        self._xty = [0.0] * FEATURES

    @property
    def samples(self) -> int:
        return self._n

    def profile(self) -> dict:
        """The fitted model as plain data (`from_profile`), to keep beside the size it was measured
        at (`scheduler.launch`): the step terms and budgets, not the fit's sums."""
        return {"step": list(self.step), "kv_tokens": self.kv_tokens, "chunk_tokens": self.chunk_tokens,
                "rank_tokens": self.rank_tokens, "prefill_tok_s": self.prefill_tok_s, "samples": self._n,
                "chunks": self._chunks}

    @classmethod
    def from_profile(cls, p: dict) -> Capacity:
        """A capacity that prices steps as the profiled one did (refitting starts from it as a prior)."""
        cap = cls(prefill_tok_s=p.get("prefill_tok_s"), step=list(p["step"]), kv_tokens=float(p["kv_tokens"]),
                  chunk_tokens=int(p["chunk_tokens"]), rank_tokens=int(p["rank_tokens"]))
        cap._n, cap._chunks = int(p.get("samples", 0)), int(p.get("chunks", 0))
        return cap

    def step_s(self, batch: float, ctx_per_seq: float, prefill_tokens: float = 0.0, prefix: float = 0.0) -> float:
        b, s, c, r, m, k, a = self.step
        t = b + s * batch + c * batch * ctx_per_seq
        if prefill_tokens > 0:
            kr = min(prefill_tokens, self.rank_tokens)
            t = max(t + r * kr + m + k * prefill_tokens + a * kr * prefix, t, 1e-6)
        return t

    def prefill_rate(self, prefix: float = 0.0) -> float:
        """Tokens a second of a prefill-only engine running full chunks after `prefix` cached tokens."""
        if not self._chunks and self.prefill_tok_s is not None:
            return self.prefill_tok_s
        return self.chunk_tokens / max(self.step_s(0, 0.0, self.chunk_tokens, prefix), 1e-9)

    def observe_prefill(self, tokens: float, seconds: float) -> None:
        """A prefill timed end to end (live: a turn's time to first token with nothing decoding)."""
        if seconds > 0 and tokens > 0:
            rate = self.prefill_rate()
            self.prefill_tok_s = rate + 0.05 * (tokens / seconds - rate)

    def observe_step(self, batch: float, ctx_tokens: float, prefill_tokens: float, seconds: float,
                     prefix: float = 0.0, weight: float = 1.0) -> None:
        if seconds <= 0:
            return
        # relative error is what matters: a decode step of 5 ms and a chunked step of 300 ms are
        # fitted alike (by absolute error the long steps swamp the short ones, and the decode
        # side, which most of the allocator's arithmetic rests on, came out 10x off)
        weight /= seconds * seconds
        k = prefill_tokens
        kr = min(k, self.rank_tokens)
        beyond = k / 1e3 if self.rank_tokens < self.chunk_tokens else 0.0  # without DP ranks: the same as K
        x = (1.0, batch / 100.0, ctx_tokens / 1e5, kr / 1e3, 1.0 if k > 0 else 0.0, beyond, kr * prefix / 1e8)
        for r in range(FEATURES):
            self._xty[r] += weight * x[r] * seconds
            for c in range(FEATURES):
                self._xtx[r][c] += weight * x[r] * x[c]
        self._n += 1
        self._chunks += prefill_tokens > 0
        if self._n % self.refit_every == 0:
            self._refit()

    def _refit(self) -> None:
        a = [[self._xtx[r][c] + (self.ridge if r == c else 0.0) for c in range(FEATURES)] for r in range(FEATURES)]
        y = [self._xty[r] + self.ridge * self._prior[r] * _SCALE[r] for r in range(FEATURES)]
        theta = _solve(a, y)
        if theta is not None:
            # a chunk-carrying step may cost less than its parts (one weight read shared): those two
            # terms may be negative; the step as a whole never is (see step_s)
            self.step = [t / s if i in (4, 5) else max(t / s, 0.0) for i, (t, s) in enumerate(zip(theta, _SCALE))]


def _solve(a: list[list[float]], y: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting (7x7: not worth a dependency)."""
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
