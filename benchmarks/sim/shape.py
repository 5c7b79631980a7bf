"""A model's shape as one GPU holds it: the fields of `steps.jsonl`, and the models we simulate.

`Shape` is the per-GPU shard (heads, kv_heads, intermediate and vocab already divided by `tp`,
exactly as `benchmarks/sim/measure.py` writes them); `Shape.shard(tp)` cuts a whole model into
that shard (Megatron-style: heads, MLP and LM head split across ranks, `hidden` and `layers`
whole). `intermediate == 0` means an attention-only shape (a MoE model's dense side; its experts
are costed apart, see `hardware.Experts`).

    >>> round(LLAMA3_8B.shard(1).weight_bytes() / 1e9, 1)
    15.0
    >>> QWEN25_32B.shard(4).heads, QWEN25_32B.shard(4).kv_heads
    (10, 2)

Non-goals: MLA attention (DeepSeek; the GQA figures stand in for it), biases and norms' weights
(under 0.1% of the bytes), embeddings (a gather, not a matmul).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

FIELDS = ("hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate", "vocab", "tp")


@dataclass(slots=True, frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int  # query heads on this GPU
    kv_heads: int  # key/value heads on this GPU
    head_dim: int
    intermediate: int  # dense MLP width on this GPU (0: attention only)
    vocab: int  # LM-head rows on this GPU
    tp: int = 1  # tensor-parallel degree this shard is one rank of
    bytes_per_param: int = 2  # bf16

    @staticmethod
    def from_row(row: dict) -> Shape:
        return Shape(**{f: int(row[f]) for f in FIELDS})

    def row(self) -> dict:
        return {f: getattr(self, f) for f in FIELDS}

    def shard(self, tp: int) -> Shape:
        """This (whole) model's shard on one of `tp` ranks."""
        if self.tp != 1:
            raise ValueError("shard a whole model (tp=1), not a shard")
        if self.heads % tp or self.intermediate % tp or self.vocab % tp:
            raise ValueError(f"tp={tp} does not divide heads/intermediate/vocab")
        kv = max(self.kv_heads // tp, 1)  # fewer KV heads than ranks: each rank keeps a copy of one
        return dataclasses.replace(self, heads=self.heads // tp, kv_heads=kv,
                                   intermediate=self.intermediate // tp, vocab=self.vocab // tp, tp=tp)

    def gemms(self) -> tuple[int, ...]:
        """Parameters of each matmul in one layer: fused QKV, output, fused gate+up, down."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        mats = [self.hidden * (q + 2 * kv), q * self.hidden]
        if self.intermediate:
            mats += [self.hidden * 2 * self.intermediate, self.intermediate * self.hidden]
        return tuple(mats)

    def params(self) -> int:
        return self.layers * sum(self.gemms()) + self.hidden * self.vocab

    def weight_bytes(self) -> int:
        return self.params() * self.bytes_per_param

    def kv_bytes_per_token(self) -> int:
        """K and V of every layer, on this GPU."""
        return self.layers * 2 * self.kv_heads * self.head_dim * self.bytes_per_param


# Whole models (tp=1), from their published configs (config.json on the Hugging Face Hub).
LLAMA3_8B = Shape(4096, 32, 32, 8, 128, 14336, 128256)  # meta-llama/Meta-Llama-3-8B
QWEN25_32B = Shape(5120, 64, 40, 8, 128, 27648, 152064)  # Qwen/Qwen2.5-32B (vocab padded to 152,064)
QWEN3_30B_A3B_ATTN = Shape(2048, 48, 32, 4, 128, 0, 151936)  # Qwen/Qwen3-30B-A3B without its experts
MODELS = {"llama3-8b": LLAMA3_8B, "qwen2.5-32b": QWEN25_32B, "qwen3-30b-a3b-attn": QWEN3_30B_A3B_ATTN}

# The two models of the vLLM CPU engine (rollout_service.local.vllm_local), from their config.json.
SMOLLM2_135M = Shape(576, 30, 9, 3, 64, 1536, 49152)  # SmolLM2-135M-Instruct (tied embeddings)
TINY_LLAMA = Shape(256, 6, 4, 2, 64, 704, 2048)  # the tests' random 5M-parameter Llama
CPU_MODELS = {"smollm2": SMOLLM2_135M, "tiny": TINY_LLAMA}
