"""The engine cost model the simulator runs on, with every parameter and where it comes from.

Extends `rollout_service.engines.sim.CostModel` (its four fields keep their meaning and
defaults: prefill 20,000 tok/s + 4 ms per request, decode step 10 ms at batch 1 + 0.1 ms per
extra sequence) with what a cluster simulation also needs. The defaults describe an assumed
8B-class dense model (GQA, bf16) on one 80 GB datacenter GPU; none of them was measured on a
GPU here (our machines have none; PLATFORM.md has the CPU figures, ~100x slower), so treat
absolute seconds as illustrative and ratios between policies as the result.

| parameter | default | why |
|---|---|---|
| prefill_tokens_per_s | 20,000 | compute-bound prefill of an 8B model on an H100-class GPU |
| prefill_overhead_s | 0.004 | launch/scheduling cost per prefill request |
| decode_step_s | 0.010 | one decode step: reading ~16 GB of weights at ~2-3 TB/s (+ overheads) |
| decode_step_per_seq_s | 0.0001 | per-sequence compute/sampling cost in a step |
| decode_step_per_ctx_s | 4e-8 | reading one context token's KV per step: 128 KiB / 3.3 TB/s |
| prefill_chunk_tokens | 2,048 | chunked-prefill budget per colocated step (vLLM max_num_batched_tokens) |
| kv_capacity_tokens | 400,000 | ~50 GiB KV cache at 128 KiB/token after weights and activations |
| kv_transfer_s_per_token | 5e-6 | 128 KiB/token over ~25 GB/s RDMA (NIXL) between GPUs |
| kv_transfer_overhead_s | 0.002 | per-transfer handshake |
| overlap | True | a colocated prefill chunk overlaps the decode's memory traffic (False: they add) |

A colocated step that carries a prefill chunk of k tokens next to B decoding sequences holding
C context tokens takes `per_seq·B + max(step + per_ctx·C, k / prefill rate)`: the chunk's
compute overlaps the decode's memory traffic (roofline), so interference is the excess, not
the sum (`overlap=False` makes it the sum: the pessimistic case for colocation, e.g. when
attention kernels for mixed batches serialise). A decode-only step is `step + per_seq·B + per_ctx·C`; a prefill-only engine runs at
the full prefill rate.

The prefix cache shares `kv_capacity_tokens` with running sequences and evicts
least-recently-used idle prefixes (see `gpu.SimGPU`).

Non-goals: modelling preemption/swapping, partial (block-level) prefix hits, network
contention between transfers.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollout_service.engines.sim import CostModel


@dataclass(slots=True)
class ClusterCost(CostModel):
    decode_step_per_ctx_s: float = 4e-8
    prefill_chunk_tokens: int = 2048
    kv_capacity_tokens: int = 400_000
    kv_transfer_s_per_token: float = 5e-6
    kv_transfer_overhead_s: float = 0.002
    overlap: bool = True

    def step_time(self, batch: int, context: float, chunk: float = 0.0) -> float:
        """One engine iteration: `batch` decoding sequences holding `context` tokens, plus a
        colocated prefill chunk of `chunk` tokens."""
        memory = self.decode_step_s + self.decode_step_per_ctx_s * context
        compute = chunk / self.prefill_tokens_per_s
        return self.decode_step_per_seq_s * batch + (max(memory, compute) if self.overlap else memory + compute)

    def transfer_time(self, tokens: int) -> float:
        return self.kv_transfer_overhead_s + tokens * self.kv_transfer_s_per_token
