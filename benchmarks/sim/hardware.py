"""A GPU's figures, and the time one engine step takes on it for a model shard (`shape.Shape`).

`GPU.step_s(shape, B, C, k, P)` is the cost of one continuous-batching iteration that carries B
decoding sequences of C context tokens each and a prefill chunk of k tokens after a cached
prefix of P tokens, as `benchmarks/sim/measure.py` times it (GPU time of a CUDA-graph replay):

    step = fixed_s
         + Σ_layers Σ_matmuls [ roofline(weight read, matmul over the step's B + k tokens) + gemm_s ]
         + roofline(LM head over the B (+1) sampled rows) + gemm_s
         + layers · attn_call_s · (attention kinds in the step: 1 or 2)
         + layers · decode attention (read B·C tokens of KV at kv_bw, slower when B·kv_heads is small)
         + layers · prefill attention (4·head_dim·heads·k·(P + k/2) FLOPs causal, k·(P + k) when a
           prefix is masked lower-right; never faster than one query tile's work on one SM)

with `roofline(m, c) = (m^p + c^p)^(1/p)`: memory time and compute time, p → ∞ is the hard max.
The linear layers run once over all tokens of the step, so a mixed step is about decode-alone +
prefill-alone minus one weight read — what the H200 data shows (README, "mixed rule"), and not
the max of the two.

`H200` is fitted by `python -m benchmarks.sim.calibrate` on `data/h200/steps.jsonl`; every field
says where it comes from. `Experts` is one GPU's share of a MoE model's expert layers, read off
`data/h200/moe.jsonl`.

    >>> from benchmarks.sim.shape import LLAMA3_8B
    >>> round(H200.step_s(LLAMA3_8B, B=1, C=512) * 1e3, 1)  # measured: 4.95 ms
    5.1
    >>> round(H200.step_s(LLAMA3_8B, B=32, C=2048, k=2048) * 1e3, 1)  # measured: 55.9 ms
    55.2

Non-goals: CPU time of a serving engine's scheduler (graph replays have none; vLLM's async
scheduling overlaps it), fused/Flash kernels' different constants (fit a preset to them with
measure.py), communication (see `cost.py`).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from dataclasses import dataclass

from benchmarks.sim.shape import Shape


@dataclass(slots=True, frozen=True)
class GPU:
    name: str
    matmul_flops: float  # effective bf16 matmul rate, FLOP/s
    weight_bw: float  # bytes/s streaming weights in a matmul
    kv_bw: float  # bytes/s reading KV in decode attention, at full occupancy
    roofline_p: float  # sharpness of the memory/compute transition (∞: max, 1: sum)
    gemm_s: float  # per matmul kernel: the floor a small matmul never goes under
    attn_call_s: float  # per attention kernel call (one per kind per layer)
    fixed_s: float  # per step, whatever the shape
    attn_causal_eff: float  # prefill attention without prefix, fraction of matmul_flops
    attn_prefix_eff: float  # prefill attention over a cached prefix (lower-right mask)
    decode_half_units: float  # B·kv_heads at which decode attention reaches half of kv_bw
    sms: int  # streaming multiprocessors (NVIDIA spec)
    attn_tile: int = 128  # query rows per attention thread block
    prefix_rect: bool = True  # the prefixed kernel does the whole k × (P + k) block
    memory_bytes: float = 80e9  # HBM (NVIDIA spec), for KV capacity
    source: str = ""  # where the figures come from

    # --- one engine step ------------------------------------------------------------------
    def matmul_s(self, params: float, rows: float) -> float:
        mem = params * 2 / self.weight_bw
        comp = 2 * params * rows / self.matmul_flops
        p = self.roofline_p
        return (mem ** p + comp ** p) ** (1 / p) + self.gemm_s

    def decode_attn_s(self, shape: Shape, B: float, C: float) -> float:
        """One layer's decode attention: B sequences of C context tokens."""
        if B <= 0 or C <= 0:
            return 0.0
        units = B * shape.kv_heads
        per_layer_token = shape.kv_bytes_per_token() / shape.layers
        return B * C * per_layer_token / (self.kv_bw * units / (units + self.decode_half_units))

    def prefill_attn_s(self, shape: Shape, k: float, P: float) -> float:
        """One layer's attention for a chunk of k tokens after P cached ones."""
        if k <= 0:
            return 0.0
        keys = P + k if (P > 0 and self.prefix_rect) else P + k / 2  # mean keys per query
        flops = 4 * shape.head_dim * shape.heads * k * keys
        tile = min(self.attn_tile, k)
        blocks = shape.heads * math.ceil(k / self.attn_tile)
        per_block = flops / blocks
        longest = 4 * shape.head_dim * tile * (P + k)  # the last query tile sees every key
        work = max(math.ceil(blocks / self.sms) * per_block, longest)  # per SM, in FLOPs
        eff = self.attn_prefix_eff if P > 0 else self.attn_causal_eff
        return work * self.sms / (self.matmul_flops * eff)

    def step_s(self, shape: Shape, B: float = 0, C: float = 0, k: float = 0, P: float = 0) -> float:
        """Seconds for one step on one GPU holding `shape`: B decodes of C context tokens each,
        plus a prefill chunk of k tokens after P cached ones (k=0: decode only; B=0: prefill only)."""
        tokens = B + k
        sampled = B + (1 if k > 0 else 0)
        kinds = (B > 0) + (k > 0)
        t = self.fixed_s
        t += shape.layers * (sum(self.matmul_s(g, tokens) for g in shape.gemms()) + kinds * self.attn_call_s)
        t += self.matmul_s(shape.hidden * shape.vocab, sampled)
        t += shape.layers * (self.decode_attn_s(shape, B, C) + self.prefill_attn_s(shape, k, P))
        return t

    def with_params(self, **kw) -> GPU:
        return dataclasses.replace(self, **kw)


# Fitted by `python -m benchmarks.sim.calibrate benchmarks/sim/data/h200/steps.jsonl` on 2026-12-04
# (all 232 rows; see benchmarks/sim/README.md for the fit's errors and each field's source).
H200 = GPU(
    name="h200",
    matmul_flops=585.1e12,
    weight_bw=3.922e12,
    kv_bw=4.498e12,
    roofline_p=2.683,
    gemm_s=8.805e-6,
    attn_call_s=4.109e-6,
    fixed_s=0.0,
    attn_causal_eff=0.9659,
    attn_prefix_eff=0.5669,
    decode_half_units=0.5323,
    sms=132,  # NVIDIA H200 (GH100, 132 SMs enabled in the SXM part)
    attn_tile=128,
    prefix_rect=True,
    memory_bytes=141e9,  # NVIDIA H200 datasheet: 141 GB HBM3e
    source="fitted 2026-12-04 to benchmarks/sim/data/h200/steps.jsonl (NVIDIA H200, torch 2.11 + CUDA 13)",
)

PRESETS = {"h200": H200}


@dataclass(slots=True, frozen=True)
class Experts:
    """One GPU's expert layers against the tokens routed to it, interpolated from measurements."""

    tokens: tuple[int, ...]
    seconds: tuple[float, ...]
    source: str = ""

    @staticmethod
    def from_rows(rows: list[dict], impl: str = "grouped", source: str = "") -> Experts:
        pts = sorted((r["T"], r["ms"] / 1e3) for r in rows if r.get("kind") == "experts" and r.get("impl") == impl)
        return Experts(tuple(t for t, _ in pts), tuple(s for _, s in pts), source)

    def step_s(self, tokens: float) -> float:
        """Linear between measured points; flat below the first, the last slope beyond the end."""
        ts, ss = self.tokens, self.seconds
        if tokens <= ts[0]:
            return ss[0]
        i = min(bisect.bisect_left(ts, tokens), len(ts) - 1)
        t0, t1, s0, s1 = ts[i - 1], ts[i], ss[i - 1], ss[i]
        return s0 + (s1 - s0) * (tokens - t0) / (t1 - t0)
