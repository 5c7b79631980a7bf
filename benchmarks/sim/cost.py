"""What an engine's steps and KV hand-overs cost in the simulator, from measured GPU figures.

An engine is `gpus` GPUs serving one model: a tensor-parallel group (`tp` ranks), or for a MoE
model a data-parallel attention group with expert parallelism (`dp` ranks). `ClusterCost`
composes its step time from:

- one rank's compute: `hardware.GPU.step_s` on the rank's shard (`shape.Shape.shard(tp)`), with
  the GPU's fitted figures (`hardware.H200`, from `data/h200/steps.jsonl`);
- for tp > 1, two all-reduces per layer of the step's activations (`AllReduce`, NCCL's figures);
- for a MoE group: the expert layers of one GPU over the tokens routed to it (`hardware.Experts`,
  from `data/h200/moe.jsonl`), a dispatch and a combine per layer (`AllToAll`, DeepEP's and
  pplx-kernels' figures), and the **DP-attention barrier**: every rank waits at each layer's
  all-to-all for the slowest, so a step takes the rank with the prefill chunk (the decode batch
  is spread evenly);
- KV hand-over between engines: `KVLink` (a fixed cost, a cost per piece — one 16-token block of
  one layer's K or V — and bytes over the link's bandwidth).

A mixed step (B decodes and a k-token chunk) runs the linear layers once over B + k tokens and
both attentions one after the other — about decode + prefill minus one weight read, as
measured; the old `overlap=True` (charge the max of the two) is gone because the data contradict
it (a mixed step took 1.02–1.84x the larger part). `PRESETS["legacy"]` keeps the old unmeasured
defaults (`ClusterCost.legacy_defaults()`), used by nothing by default.

Every figure and its source is in `benchmarks/sim/README.md`.

Approximations: a DP group's step budget (2,048 tokens a rank) is shared by whatever prefill is
queued, as if prompts could be spread over ranks (a real group keeps one prompt on one rank).

Non-goals: preemption, partial prefix hits, contention between transfers, pipeline parallelism.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from benchmarks.sim.hardware import GPU, H200, Experts
from benchmarks.sim.shape import LLAMA3_8B, QWEN3_30B_A3B_ATTN, QWEN25_32B, Shape

DATA = Path(__file__).parent / "data" / "h200"


@dataclass(slots=True, frozen=True)
class AllReduce:
    """NCCL ring all-reduce time: the cheaper of the LL and Simple protocols, NCCL's own model."""

    busbw: float = 450e9  # bytes/s: NVLink 4, 900 GB/s bidirectional per H200 (NVIDIA datasheet)
    ll_base_s: float = 3.6e-6  # NCCL src/graph/tuning.cc: baseLat, Ring/LL
    ll_hop_s: float = 0.47e-6  # hwLat NVLink Ring/LL, per step (2(n-1) steps)
    simple_base_s: float = 8.4e-6  # baseLat Ring/Simple
    simple_hop_s: float = 3.4e-6  # hwLat NVLink Ring/Simple
    ll_bw_fraction: float = 0.25  # tuning.cc: LL ring all-reduce runs at busBw/4

    def time(self, nbytes: float, ranks: int) -> float:
        if ranks <= 1:
            return 0.0
        steps = 2 * (ranks - 1)
        wire = nbytes * steps / ranks  # busbw counts 2(n-1)/n of the payload
        ll = self.ll_base_s + steps * self.ll_hop_s + wire / (self.busbw * self.ll_bw_fraction)
        simple = self.simple_base_s + steps * self.simple_hop_s + wire / self.busbw
        return min(ll, simple)


NVLINK_CALL_S = 41e-6  # an all-to-all call (dispatch or combine), pplx-kernels EP8 over NVLink
# DeepEP V1 low-latency kernels, (dispatch, combine) seconds at 128 tokens a rank (docs/legacy.md)
INTERNODE_LOW_LATENCY = {16: (118e-6, 195e-6), 32: (155e-6, 273e-6)}


@dataclass(slots=True, frozen=True)
class AllToAll:
    """MoE dispatch (FP8) + combine (BF16) per layer over NVLink. Bandwidth: DeepEP reaches 96% of
    the link (V1 on H800, docs/legacy.md: 153/158 GB/s of ~160 GB/s at EP8) and 81% (V2 on B200,
    README: 726/740 of 900 GB/s); we take 80% of the H200's 450 GB/s a direction. Per call:
    pplx-kernels' EP8 NVLink kernels (README, "Benchmark Results") take 41.6 µs to dispatch and
    41.7 µs to combine 1 token a GPU, 83.6 / 102.3 µs for 128; the line through the two points
    leaves 41.3 / 41.2 µs at zero tokens (derivation in benchmarks/sim/README.md)."""

    dispatch_bw: float = 360e9
    combine_bw: float = 360e9
    latency_s: float = NVLINK_CALL_S

    def time(self, tokens: float, hidden: int, top_k: int) -> float:
        if tokens <= 0:
            return 0.0
        routed = tokens * top_k * hidden
        return 2 * self.latency_s + routed * 1 / self.dispatch_bw + routed * 2 / self.combine_bw

    @classmethod
    def internode(cls, ep: int) -> AllToAll:
        """EP16 / EP32 spans 2 / 4 nodes: dispatch and combine go over RDMA. DeepEP V1's low-latency
        kernels (docs/legacy.md, H800 with a 400 Gb/s ConnectX-7 a GPU, the NIC of an H200 node; 128
        tokens a rank, 7168 hidden, top-8, FP8 dispatch, BF16 combine) take 118 / 195 µs at EP16 and
        155 / 273 µs at EP32. Keeping the NVLink per-call floor (41 µs, no RDMA call is quicker),
        the bytes of those points (7.3 MB dispatched, 14.7 MB combined a rank) leave the bandwidth:
        95 / 95 GB/s at EP16, 64 / 63 GB/s at EP32."""
        if ep not in INTERNODE_LOW_LATENCY:
            raise ValueError(f"no measured internode all-to-all for EP{ep}")
        dispatch_s, combine_s = INTERNODE_LOW_LATENCY[ep]
        routed = 128 * 8 * 7168  # tokens a rank · top-k · hidden
        return cls(dispatch_bw=routed * 1 / (dispatch_s - NVLINK_CALL_S),
                   combine_bw=routed * 2 / (combine_s - NVLINK_CALL_S))


@dataclass(slots=True, frozen=True)
class KVLink:
    """Moving a context's KV: fixed + pieces · per_piece + bytes / bandwidth."""

    name: str
    bytes_per_s: float
    per_piece_s: float
    fixed_s: float
    block_tokens: int = 16  # vLLM's default KV block

    def pieces(self, tokens: int, shape: Shape) -> int:
        return math.ceil(tokens / self.block_tokens) * shape.layers * 2  # K and V of each layer, each block

    def move_s(self, nbytes: float, pieces: int) -> float:
        return self.fixed_s + pieces * self.per_piece_s + nbytes / self.bytes_per_s

    def time(self, tokens: int, shape: Shape) -> float:
        """A context of `tokens` tokens of `shape` (one rank's shard) in vLLM's block layout."""
        if tokens <= 0:
            return 0.0
        return self.move_s(tokens * shape.kv_bytes_per_token(), self.pieces(tokens, shape))


# data/h200/copies.jsonl: 55.4 GB/s host<->device for 1 GiB; one 512 MiB context as 1,024 pieces
# takes 12.26 ms against 9.70 ms as one, 2.5 µs per extra piece (64 pieces: 2.7 µs).
HOST_TIER = KVLink("host", bytes_per_s=55.4e9, per_piece_s=2.5e-6, fixed_s=17e-6)  # fixed: a 64 KiB copy
# GPU to GPU between nodes (derivations in benchmarks/sim/README.md): one 400 Gb/s ConnectX-7 port
# per GPU (NVIDIA DGX H200 datasheet) = 50 GB/s. Per piece (one RDMA descriptor): 0.7 µs, from
# vLLM PR #53825 on two H200 nodes (Mooncake over 400 Gb/s RDMA): the same 16k-token KV took
# 5.2 ms as 4,563 descriptors a rank and 2.1 ms as ~70, 3.1 ms / 4,493 descriptors. Fixed: 1.3 ms,
# from vLLM's NIXL connector (`Avg xfer time`, posting to completion seen by the decode worker):
# 1.381 ms for 2.25 MB in 72 descriptors (vLLM issue #41230), less bytes and descriptors.
# A role switch that re-launches an engine re-captures its CUDA graphs: measured warm-up + capture of
# 67 decode batch sizes on an H200, median of four runs (data/h200/capture.jsonl; README derivation (d)).
GRAPH_CAPTURE_S = 9.4
RDMA = KVLink("rdma", bytes_per_s=50e9, per_piece_s=0.7e-6, fixed_s=1.3e-3)


@lru_cache(maxsize=1)
def qwen3_moe() -> MoE:
    """Qwen3-30B-A3B's experts on one GPU of an EP8 group, as measured (data/h200/moe.jsonl)."""
    rows = [json.loads(x) for x in (DATA / "moe.jsonl").read_text().splitlines() if x.strip()]
    head = next(r for r in rows if "expert_params_this_gpu" in r)
    experts = Experts.from_rows(rows, "grouped", "data/h200/moe.jsonl (grouped GEMM, EP8 share of Qwen3-30B-A3B)")
    return MoE(head["hidden"], head["top_k"], experts, head["expert_params_this_gpu"])


@dataclass(slots=True, frozen=True)
class Linear:
    """The simulator's step model before issue 23: assumed, never measured (`ClusterCost.legacy_defaults`)."""

    prefill_tok_s: float = 20_000.0
    step_s: float = 0.010
    per_seq_s: float = 1e-4
    per_ctx_s: float = 4e-8
    transfer_per_token_s: float = 5e-6
    transfer_fixed_s: float = 0.002


@dataclass(slots=True, frozen=True)
class MoE:
    """Expert side of a MoE model under expert parallelism, as one GPU sees it."""

    hidden: int
    top_k: int
    experts: Experts
    params_per_gpu: int  # expert weights one GPU holds


@dataclass(slots=True)
class ClusterCost:
    """Step and transfer times of one engine. Build one with a classmethod (`dense`, `moe_dp`,
    `legacy_defaults`) or `PRESETS[name]()`."""

    shape: Shape = LLAMA3_8B  # the whole model
    gpu: GPU = H200
    tp: int = 1
    dp: int = 1  # data-parallel attention ranks (a MoE group); 1 for a dense model
    moe: MoE | None = None
    prefill_chunk_tokens: int = 2048  # vLLM max_num_batched_tokens: token budget of one step
    kv_capacity_tokens: int = 0  # 0: from the GPU's memory (see __post_init__)
    memory_utilization: float = 0.9  # vLLM gpu_memory_utilization default
    link: KVLink = RDMA
    allreduce: AllReduce = field(default_factory=AllReduce)
    alltoall: AllToAll = field(default_factory=AllToAll)
    prefill_overhead_s: float = 0.0  # per request; graph-replayed steps have none
    # Prefix-cache hits count whole KV blocks only (vLLM). 1: token-exact, the GPU presets' figure
    # so far (vLLM's GPU block is 16 tokens, under 1% of a turn there); the CPU engine's block is
    # 128 tokens (docs/vllm_notes.md), so a turn recomputes up to 127 cached tokens.
    prefix_block_tokens: int = 1
    dp_balanced: bool = True  # a balancing dispatcher spreads a DP group's decodes evenly; False: at random
    # Role switch. Default: the service's mechanism today (scheduler/roles.py): every engine runs
    # kv_both, a role is a routing decision, so a switch is instant and keeps the cache; in-flight
    # work finishes where it is. `restart_switch()`: an engine re-launched in its new role drains
    # first, then re-captures CUDA graphs with an empty prefix cache. 9.4 s: measured on an H200
    # (`data/h200/capture.jsonl`, `measure.py --capture`): 67 decode batch sizes warmed up and
    # captured in 7.6-9.5 s (Llama-3-8B twice, Qwen2.5-32B TP2 and TP4 shards); vLLM's own logs
    # show 14 s and ~6 s (PRs #11349, #46389). Weight loading and compilation are not counted.
    switch_s: float = 0.0
    flush_on_switch: bool = False

    @property
    def routing_switch(self) -> bool:
        return self.switch_s == 0 and not self.flush_on_switch

    def restart_switch(self, switch_s: float = GRAPH_CAPTURE_S) -> ClusterCost:
        return dataclasses.replace(self, switch_s=switch_s, flush_on_switch=True)
    legacy: Linear | None = None  # the old model, for the `legacy` preset only
    _rank: Shape = field(init=False, repr=False)
    _lin: dict = field(init=False, repr=False, default_factory=dict)
    _pf_rate: float = field(init=False, repr=False, default=0.0)

    def __post_init__(self) -> None:
        self._rank = self.shape.shard(self.tp) if self.tp > 1 else self.shape
        if not self.kv_capacity_tokens and self.legacy is None:
            free = self.gpu.memory_bytes * self.memory_utilization - self._weights_per_gpu()
            self.kv_capacity_tokens = int(max(free, 0) / self._rank.kv_bytes_per_token()) * self.dp

    # --- presets ----------------------------------------------------------------------------
    @classmethod
    def dense(cls, shape: Shape, tp: int = 1, gpu: GPU = H200, **kw) -> ClusterCost:
        return cls(shape=shape, gpu=gpu, tp=tp, **kw)

    @classmethod
    def moe_dp(cls, dp: int = 8, gpu: GPU = H200, **kw) -> ClusterCost:
        """Qwen3-30B-A3B: attention data-parallel over `dp` ranks, 128 experts spread over them.
        DP16 / DP32 (a group over 2 / 4 nodes) take the all-to-all over RDMA (`AllToAll.internode`)
        and hold 8 / 4 experts a GPU (weights, so KV room, from that), but keep the expert *time*
        measured as one GPU of EP8 (16 experts) for the same tokens routed to a GPU: at decode
        batches that reads more expert weights than a GPU of EP16/32 holds, so the step's fixed
        part is overstated, which dilutes the stall a prefill chunk adds and understates what a
        split wins (the direction a guess should err in here; an EP16 measurement would replace it)."""
        if dp not in (8, 16, 32):
            raise ValueError("DP-attention groups of 8 (NVLink), 16 or 32 ranks (RDMA) are modelled")
        moe = qwen3_moe()
        if dp > 8:
            moe = dataclasses.replace(moe, params_per_gpu=moe.params_per_gpu * 8 / dp)
            kw.setdefault("alltoall", AllToAll.internode(dp))
        return cls(shape=QWEN3_30B_A3B_ATTN, gpu=gpu, dp=dp, moe=moe, **kw)

    @classmethod
    def legacy_defaults(cls) -> ClusterCost:
        """The simulator's defaults before issue 23 (assumed, never measured): prefill 20k tok/s
        + 4 ms a request, decode 10 ms + 0.1 ms a sequence + 4e-8 s a context token, a chunk
        overlapping the decode (max), 400k KV tokens, 5 µs a token + 2 ms a transfer."""
        return cls(prefill_overhead_s=0.004, kv_capacity_tokens=400_000, legacy=Linear())

    # --- what the simulator asks --------------------------------------------------------------
    @property
    def gpus(self) -> int:
        return self.tp * self.dp

    @property
    def step_tokens(self) -> int:
        """Prefill tokens one step takes at most: the chunk budget on each DP rank."""
        return self.prefill_chunk_tokens * self.dp

    def step_time(self, batch: int, context: float, chunk: float = 0.0, prefix: float = 0.0) -> float:
        """One engine iteration: `batch` decoding sequences holding `context` tokens in all, plus
        a prefill chunk of `chunk` tokens after `prefix` cached ones."""
        if self.legacy is not None:
            lg = self.legacy
            return lg.per_seq_s * batch + max(lg.step_s + lg.per_ctx_s * context, chunk / lg.prefill_tok_s)
        k = math.ceil(chunk) if chunk > 0 else 0
        if self.dp > 1:
            return self._group_step(batch, context, k, prefix)
        b = batch
        t = self._linear(b, k) + self._rank.layers * (
            self.gpu.decode_attn_s(self._rank, b, context / b if b else 0.0) + self.gpu.prefill_attn_s(self._rank, k, prefix))
        return t

    def prefill_time(self, tokens: float, prefix: float = 0.0) -> float:
        """A prefill-only engine prefilling `tokens` after `prefix` cached ones, in chunks."""
        t, done = 0.0, 0.0
        while done < tokens:
            k = min(self.step_tokens, tokens - done)
            t += self.step_time(0, 0.0, k, prefix + done)
            done += k
        return t

    def transfer_time(self, tokens: int) -> float:
        if self.legacy is not None:
            return self.legacy.transfer_fixed_s + tokens * self.legacy.transfer_per_token_s
        return self.link.time(tokens, self._rank)  # every rank sends its shard at once, over its own port

    @property
    def prefill_tokens_per_s(self) -> float:
        """At the step's token budget, no prefix: for drain estimates and the allocator's prior."""
        if self.legacy is not None:
            return self.legacy.prefill_tok_s
        if not self._pf_rate:
            self._pf_rate = self.step_tokens / self.step_time(0, 0.0, self.step_tokens)
        return self._pf_rate

    @property
    def decode_step_s(self) -> float:
        return self.legacy.step_s if self.legacy is not None else self.step_time(1, 1000.0)

    def prior(self) -> list[float]:
        """The true cost model projected on the allocator's step features (`scheduler.capacity`):
        a least-squares fit over a grid of steps (1-512 sequences, 0.5k-16k tokens each, chunks up
        to the step budget). Only the hindsight oracle gets it; guided allocation measures its own."""
        if self.legacy is not None:
            lg = self.legacy
            return [lg.step_s, lg.per_seq_s, lg.per_ctx_s, 1.0 / lg.prefill_tok_s, 0.0, 0.0, 0.0]
        from scheduler.capacity import Capacity  # the allocator's features, fitted here

        cap = Capacity(chunk_tokens=self.step_tokens, rank_tokens=self.prefill_chunk_tokens, ridge=1e-6,
                       refit_every=1 << 30)
        for b in (0, 1, 16, 64, 256, 512):
            for ctx in (512, 4096, 16384):
                for k in (0, 128, 512, 1024, 2048, self.step_tokens // 2, self.step_tokens):
                    for prefix in ((0, 4096, 16384, 32768) if k else (0,)):
                        if (b or k) and b * ctx <= self.kv_capacity_tokens:
                            y = self.step_time(b, b * ctx, k, prefix)
                            cap.observe_step(b, b * ctx, k, y, prefix)  # relative errors alike (observe_step weighs by 1/y²)
        cap._refit()
        return list(cap.step)

    def describe(self) -> dict:
        """What the benchmark's JSON records about this cost model."""
        if self.legacy is not None:
            return {"preset": "legacy", **dataclasses.asdict(self.legacy)}
        return {"model": self.shape.row(), "gpu": self.gpu.name, "gpu_source": self.gpu.source, "tp": self.tp,
                "dp": self.dp, "dp_balanced": self.dp_balanced, "switch_s": self.switch_s,
                "flush_on_switch": self.flush_on_switch, "moe": self.moe is not None, "prefill_chunk_tokens": self.prefill_chunk_tokens,
                "kv_capacity_tokens": self.kv_capacity_tokens, "link": dataclasses.asdict(self.link),
                "allreduce": dataclasses.asdict(self.allreduce)}

    # --- the pieces -----------------------------------------------------------------------------
    def _weights_per_gpu(self) -> float:
        w = self._rank.weight_bytes()
        if self.moe is not None:
            w += self.moe.params_per_gpu * self._rank.bytes_per_param
        return w

    def _linear(self, b: int, k: int) -> float:
        """Everything in a step that depends only on its token counts (cached: called per event)."""
        key = (b, k)
        t = self._lin.get(key)
        if t is None:
            g, s = self.gpu, self._rank
            tokens, sampled, kinds = b + k, b + (1 if k else 0), (b > 0) + (k > 0)
            t = g.fixed_s + s.layers * (sum(g.matmul_s(m, tokens) for m in s.gemms()) + kinds * g.attn_call_s)
            t += g.matmul_s(s.hidden * s.vocab, sampled)
            t += 2 * s.layers * self.allreduce.time(tokens * s.hidden * s.bytes_per_param, self.tp)
            if len(self._lin) > 200_000:
                self._lin.clear()
            self._lin[key] = t
        return t

    def busiest_rank(self, batch: int) -> int:
        """Decodes on a DP group's busiest rank. Balanced: ⌈B/G⌉. At random (no balancing dispatcher):
        the expected maximum of B requests thrown into G bins, B/G + √(2·(B/G)·ln G) (Raab & Steger,
        "Balls into bins", 1998, for B ≥ G·ln G), and never more than B."""
        if not batch:
            return 0
        mean = batch / self.dp
        if self.dp_balanced or self.dp == 1:
            return math.ceil(mean)
        return min(batch, math.ceil(mean + math.sqrt(2 * mean * math.log(self.dp))))

    def _group_step(self, batch: int, context: float, k: int, prefix: float) -> float:
        """A DP-attention group: decodes spread evenly over the ranks, prefill chunks of up to the
        budget on as many ranks as they fill; every rank waits for the slowest at each layer's
        all-to-all, so the step is that rank's attention side + the experts + the all-to-alls."""
        g, s, moe = self.gpu, self._rank, self.moe
        b = self.busiest_rank(batch)
        ctx = context / batch if batch else 0.0
        kr = min(k, self.prefill_chunk_tokens)  # the slowest rank's chunk
        slowest = self._linear(b, kr) + s.layers * (g.decode_attn_s(s, b, ctx) + g.prefill_attn_s(s, kr, prefix))
        if moe is None:
            return slowest
        experts = moe.experts.step_s((batch + k) * moe.top_k / self.dp)  # experts spread evenly over the ranks
        return slowest + experts + s.layers * self.alltoall.time(b + kr, moe.hidden, moe.top_k)


PRESETS = {
    "llama3-8b-tp1": lambda: ClusterCost.dense(LLAMA3_8B, 1),
    "qwen2.5-32b-tp2": lambda: ClusterCost.dense(QWEN25_32B, 2),
    "qwen2.5-32b-tp4": lambda: ClusterCost.dense(QWEN25_32B, 4),
    "qwen3-30b-a3b-dp8ep8": lambda: ClusterCost.moe_dp(8),
    "qwen3-30b-a3b-dp16ep16": lambda: ClusterCost.moe_dp(16),
    "qwen3-30b-a3b-dp32ep32": lambda: ClusterCost.moe_dp(32),
    "legacy": ClusterCost.legacy_defaults,
}
DEFAULT = "llama3-8b-tp1"
