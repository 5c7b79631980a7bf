"""The simulator's cost model: each term's effect in isolation, and its fit to the H200 data."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from benchmarks.sim.cost import HOST_TIER, PRESETS, RDMA, AllReduce, AllToAll, ClusterCost, KVLink
from benchmarks.sim.hardware import H200
from benchmarks.sim.shape import LLAMA3_8B, QWEN3_30B_A3B_ATTN, QWEN25_32B, Shape

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "sim" / "data" / "h200"


def rows(name: str) -> list[dict]:
    return [json.loads(x) for x in (DATA / name).read_text().splitlines() if x.strip()]


# --- one GPU's step ----------------------------------------------------------------------------
def test_a_mixed_step_is_its_parts_minus_the_shared_weight_read():
    d = H200.step_s(LLAMA3_8B, B=32, C=2048)
    p = H200.step_s(LLAMA3_8B, k=512)
    mixed = H200.step_s(LLAMA3_8B, B=32, C=2048, k=512)
    weight_read = LLAMA3_8B.weight_bytes() / H200.weight_bw
    # it exceeds its larger part by about the smaller part minus one weight read, so it is not the max ...
    assert mixed - max(d, p) == pytest.approx(min(d, p) - weight_read, rel=0.15)
    assert mixed > 1.15 * max(d, p)
    # ... and the saving against the sum fades as the chunk grows (measured 0.75-0.97x at k=256, ~0.97x at 4k)
    ratio = {k: H200.step_s(LLAMA3_8B, B=128, C=2048, k=k)
             / (H200.step_s(LLAMA3_8B, B=128, C=2048) + H200.step_s(LLAMA3_8B, k=k)) for k in (256, 4096)}
    assert 0.75 <= ratio[256] < ratio[4096] <= 1.0


def test_tensor_parallel_shards_scale_prefill_near_linearly():
    t1, t4, t8 = (H200.step_s(QWEN25_32B.shard(tp), k=2048) for tp in (1, 4, 8))
    assert 3.4 < t1 / t4 <= 4.0 and 6.0 < t1 / t8 <= 8.0  # measured 220 / 59 / 31 ms: 3.7x, 7.1x


def test_decode_attention_reads_each_context_token_once_per_step():
    b = 64
    extra = H200.step_s(LLAMA3_8B, B=b, C=8192) - H200.step_s(LLAMA3_8B, B=b, C=4096)
    read = b * 4096 * LLAMA3_8B.kv_bytes_per_token() / H200.kv_bw
    assert extra == pytest.approx(read, rel=0.02)  # many sequences: the KV read runs at full bandwidth
    few = H200.step_s(LLAMA3_8B, B=1, C=8192) - H200.step_s(LLAMA3_8B, B=1, C=4096)
    assert few > 4096 * LLAMA3_8B.kv_bytes_per_token() / H200.kv_bw  # one sequence cannot fill the GPU


def test_a_small_decode_step_is_the_weight_read_plus_per_kernel_floors():
    t = H200.step_s(LLAMA3_8B, B=1, C=512)
    read = LLAMA3_8B.weight_bytes() / H200.weight_bw
    floors = LLAMA3_8B.layers * (4 * H200.gemm_s + H200.attn_call_s) + H200.gemm_s
    assert t == pytest.approx(read + floors, rel=0.05)
    assert H200.with_params(weight_bw=2 * H200.weight_bw).step_s(LLAMA3_8B, B=1, C=512) < t - 0.4 * read


def test_prefill_attention_grows_with_prefix_and_never_beats_one_tile_per_sm():
    p0, p32k = (H200.step_s(LLAMA3_8B, k=256, P=p) for p in (0, 32768))
    assert p32k > 3 * p0  # measured 8.1 -> 33.4 ms
    # a chunk too small to fill the SMs takes as long per layer whatever the head count
    narrow, wide = (H200.prefill_attn_s(QWEN25_32B.shard(tp), 256, 32768) for tp in (8, 1))
    assert narrow == pytest.approx(wide, rel=0.01)


def test_the_preset_reproduces_the_h200_rows():
    errs = sorted(abs(H200.step_s(Shape.from_row(r), r["B"], r["C"], r["k"], r["P"]) * 1e3 / r["ms"] - 1)
                  for r in rows("steps.jsonl"))
    assert errs[len(errs) // 2] < 0.05 and errs[-1] < 0.25


# --- an engine: communication and groups -------------------------------------------------------
def test_all_reduce_adds_to_tensor_parallel_steps_only():
    tp1, tp4 = ClusterCost.dense(QWEN25_32B, 1), ClusterCost.dense(QWEN25_32B, 4)
    assert tp1.step_time(64, 64 * 2048) == pytest.approx(H200.step_s(QWEN25_32B, 64, 2048), rel=1e-9)
    rank = H200.step_s(QWEN25_32B.shard(4), 64, 2048)
    ar = AllReduce().time(64 * QWEN25_32B.hidden * 2, 4)
    assert tp4.step_time(64, 64 * 2048) == pytest.approx(rank + 2 * QWEN25_32B.layers * ar, rel=1e-9)


def test_all_reduce_follows_nccl_latency_for_small_and_bandwidth_for_large_messages():
    ar = AllReduce()
    assert ar.time(1024, 8) == pytest.approx(3.6e-6 + 14 * 0.47e-6, rel=0.05)
    big = 1 << 30
    assert ar.time(big, 8) == pytest.approx(big * 2 * 7 / 8 / ar.busbw, rel=0.02)
    assert ar.time(big, 1) == 0.0


def test_all_to_all_per_call_cost_is_the_cited_one_token_latency():
    a2a = AllToAll()
    # pplx-kernels, EP8 over NVLink, hidden 7168, top-8: dispatch 41.6 µs + combine 41.7 µs at 1 token a GPU
    assert a2a.time(1, 7168, 8) == pytest.approx(41.6e-6 + 41.7e-6, rel=0.02)
    assert a2a.time(1, 7168, 8) - 2 * a2a.latency_s < 1e-6  # one token is all latency ...
    assert a2a.time(2048, 2048, 8) > 2 * (2 * a2a.latency_s)  # ... a 2,048-token chunk mostly bytes
    assert a2a.time(0, 7168, 8) == 0.0


def test_an_internode_all_to_all_reproduces_deepeps_low_latency_points():
    # DeepEP V1 low-latency kernels, 128 tokens a rank, hidden 7168, top-8: dispatch + combine
    assert AllToAll.internode(16).time(128, 7168, 8) == pytest.approx(118e-6 + 195e-6, rel=1e-6)
    assert AllToAll.internode(32).time(128, 7168, 8) == pytest.approx(155e-6 + 273e-6, rel=1e-6)
    assert AllToAll.internode(16).latency_s == AllToAll().latency_s  # the NVLink per-call floor
    with pytest.raises(ValueError):
        AllToAll.internode(64)  # not measured: not modelled


def test_larger_dp_groups_cross_nodes_hold_fewer_experts_and_stall_more_per_chunk():
    """DP16/DP32 groups span nodes: their all-to-all is RDMA's, each GPU holds 8/4 of the 128 experts
    (more room for KV), and a prefill chunk on one rank costs every rank more than in DP8."""
    groups = {dp: ClusterCost.moe_dp(dp) for dp in (8, 16, 32)}
    assert groups[8].alltoall == AllToAll() and groups[16].alltoall == AllToAll.internode(16)
    assert groups[16].moe.params_per_gpu == pytest.approx(groups[8].moe.params_per_gpu / 2)
    assert groups[32].kv_capacity_tokens / 32 > groups[16].kv_capacity_tokens / 16 > groups[8].kv_capacity_tokens / 8
    stall = {dp: c.step_time(32 * dp, 32 * dp * 2048, 2048) - c.step_time(32 * dp, 32 * dp * 2048)
             for dp, c in groups.items()}  # 32 decodes a rank, one 2,048-token chunk
    assert stall[8] < stall[16] < stall[32]
    with pytest.raises(ValueError):
        ClusterCost.moe_dp(4)


def test_one_rank_prefilling_stalls_the_whole_dp_attention_group():
    moe = PRESETS["qwen3-30b-a3b-dp8ep8"]()
    decode = moe.step_time(256, 256 * 2048)
    with_chunk = moe.step_time(256, 256 * 2048, 2048)
    one_rank_chunk = H200.step_s(QWEN3_30B_A3B_ATTN, 32, 2048, 2048) - H200.step_s(QWEN3_30B_A3B_ATTN, 32, 2048)
    assert with_chunk - decode > one_rank_chunk  # every rank waits for the one with the chunk
    # the group's decode step: one rank's attention side + its experts + two all-to-alls per layer
    assert decode > H200.step_s(QWEN3_30B_A3B_ATTN, 32, 2048) + moe.moe.experts.step_s(256)


def test_experts_interpolate_the_measured_rows():
    ex = PRESETS["qwen3-30b-a3b-dp8ep8"]().moe.experts
    measured = {r["T"]: r["ms"] for r in rows("moe.jsonl") if r.get("impl") == "grouped"}
    assert all(ex.step_s(t) * 1e3 == pytest.approx(ms) for t, ms in measured.items())
    assert measured[2048] < ex.step_s(3000) * 1e3 < measured[4096]


def test_many_small_kv_pieces_cost_more_than_one():
    nbytes = 512 << 20
    assert HOST_TIER.move_s(nbytes, 1024) > HOST_TIER.move_s(nbytes, 1) * 1.2
    for r in rows("copies.jsonl"):  # the host tier reproduces the measured copies up to 1,024 pieces
        if r["kind"] == "pieces" and r["pieces"] <= 1024:
            assert HOST_TIER.move_s(r["bytes"], r["pieces"]) * 1e3 == pytest.approx(r["h2d_ms"], rel=0.03)
    coarse = KVLink("coarse", RDMA.bytes_per_s, RDMA.per_piece_s, RDMA.fixed_s, block_tokens=4096)
    fine, few = RDMA.time(4096, LLAMA3_8B), coarse.time(4096, LLAMA3_8B)  # 16k pieces of 32 KiB vs 64
    assert fine - few == pytest.approx((16384 - 64) * RDMA.per_piece_s) and fine > 1.5 * few
    # the network's per-piece cost is its own (vLLM PR #53825, H200 + 400 Gb/s RDMA: the same KV took
    # 5.2 ms as 4,563 descriptors and 2.1 ms as ~70), not the copy engine's
    assert RDMA.move_s(nbytes, 4563) - RDMA.move_s(nbytes, 70) == pytest.approx(5.2e-3 - 2.1e-3, rel=0.05)
    assert RDMA.per_piece_s < HOST_TIER.per_piece_s


def test_kv_capacity_is_what_the_weights_leave_of_the_gpu():
    c = ClusterCost.dense(LLAMA3_8B, 1)
    assert c.kv_capacity_tokens == int((141e9 * 0.9 - LLAMA3_8B.weight_bytes()) / LLAMA3_8B.kv_bytes_per_token())
    assert ClusterCost.dense(QWEN25_32B, 4).kv_capacity_tokens > 2 * ClusterCost.dense(QWEN25_32B, 2).kv_capacity_tokens


def test_legacy_preset_keeps_the_old_overlapping_model():
    old = PRESETS["legacy"]()
    assert old.step_time(10, 1000, 2048) == pytest.approx(10 * 1e-4 + max(0.010 + 4e-8 * 1000, 2048 / 20_000))
    assert old.transfer_time(1000) == pytest.approx(0.002 + 1000 * 5e-6)


def test_without_a_balancing_dispatcher_the_busiest_dp_rank_sets_the_step():
    balanced = PRESETS["qwen3-30b-a3b-dp8ep8"]()
    random = dataclasses.replace(balanced, dp_balanced=False)
    assert balanced.busiest_rank(256) == 32
    assert random.busiest_rank(256) == 32 + math.ceil(math.sqrt(2 * 32 * math.log(8)))  # balls into bins
    assert random.busiest_rank(3) <= 3 and random.busiest_rank(0) == 0
    decode = balanced.step_time(256, 256 * 2048)
    assert random.step_time(256, 256 * 2048) > 1.05 * decode  # every rank waits for the fullest one
    dense = ClusterCost.dense(LLAMA3_8B, 1)
    assert dataclasses.replace(dense, dp_balanced=False).step_time(64, 64 * 2048) == dense.step_time(64, 64 * 2048)
