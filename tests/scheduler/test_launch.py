"""Launch planning: each role's engine size and count, ranked on a phase's demand with a step
model per size; and the allocator pricing prefill engines at their own size."""

from __future__ import annotations

import pytest

from scheduler.allocator import Allocator, AllocatorConfig, Capacity, Layout
from scheduler.forecast import Demand
from scheduler.launch import Launch, candidates, plan, score

# Decode steps that cost mostly a weight read, as dense models' do: an engine of 4 GPUs reads a
# quarter of the weights on each GPU and splits each sequence's work four ways, plus what the
# split costs (communication), so it steps 4x the sequences in about half the time of an engine of
# 1 GPU. Its prefill is the same FLOPs split four ways, at half the rate per GPU (an all-reduce a layer).
SMALL = Capacity(step=[0.004, 2e-5, 1e-8, 8e-5], chunk_tokens=2048, kv_tokens=100_000)
LARGE = Capacity(step=[0.0015, 5e-6, 2.5e-9, 4e-5], chunk_tokens=2048, kv_tokens=700_000)
PROFILES = {1: SMALL, 4: LARGE}

DECODE_HEAVY = Demand(15, 20_000, 400_000, 256, 2000, prefill_arrivals=20_000, turns=200, live=256,
                      mean_response=400)
PREFILL_HEAVY = Demand(15, 2e6, 40_000, 256, 2000, prefill_arrivals=2e6, turns=400, live=256, mean_response=100)


def test_a_launch_counts_its_gpus_and_refuses_nonsense():
    assert Launch(4, 0, 2).gpus == 8 and Launch(4, 1, prefill=4, prefill_size=1).gpus == 8
    assert Launch(2, 3, prefill=2).gpus == 10 and Launch(2, 3, prefill=2).prefill_gpus == 2
    assert Launch(4, 1, prefill=4, prefill_size=1).layout == Layout(4, 1, 0)
    with pytest.raises(ValueError):
        Launch(0, 1)
    with pytest.raises(ValueError):
        Launch(4, 0)
    with pytest.raises(ValueError):
        Launch(4, -1, mixed=2)


def test_the_prefill_engines_own_capacity_prices_their_prefill_alone():
    fast = Capacity(step=[0.004, 2e-5, 1e-8, 2e-5], chunk_tokens=2048, kv_tokens=100_000)  # 4x the prefill rate
    same = Allocator([f"e{i}" for i in range(5)], SMALL, AllocatorConfig(response_kv_pushed=True))
    own = Allocator([f"e{i}" for i in range(5)], SMALL, AllocatorConfig(response_kv_pushed=True), prefill_capacity=fast)
    split = Layout(1, 4, 0)
    assert own.estimate(split, PREFILL_HEAVY) < 0.5 * same.estimate(split, PREFILL_HEAVY)  # prefill-bound: faster
    colocated = Layout(0, 0, 5)  # no prefill engine: the same estimate
    assert own.estimate(colocated, PREFILL_HEAVY) == same.estimate(colocated, PREFILL_HEAVY)
    assert own.estimate(split, DECODE_ONLY) == same.estimate(split, DECODE_ONLY)  # nothing to prefill


DECODE_ONLY = Demand(horizon_s=15, prefill_tokens=0, decode_tokens=64_000, decode_seqs=64, mean_context=1000)


def test_decode_heavy_work_launches_fewer_larger_engines_and_prefill_heavy_more_smaller_ones():
    ranked = plan([Launch(1, 0, 8), Launch(4, 0, 2)], [DECODE_HEAVY] * 3, PROFILES)
    assert ranked[0][0] == Launch(4, 0, 2)
    assert ranked[0][1] < 0.7 * ranked[1][1]
    ranked = plan([Launch(1, 0, 8), Launch(4, 0, 2)], [PREFILL_HEAVY] * 3, PROFILES)
    assert ranked[0][0] == Launch(1, 0, 8)
    assert ranked[0][1] < 0.7 * ranked[1][1]


def test_the_score_sums_the_phase_and_a_missing_size_is_named():
    one = score(Launch(4, 0, 2), [DECODE_HEAVY], PROFILES)
    assert score(Launch(4, 0, 2), [DECODE_HEAVY, DECODE_HEAVY], PROFILES) == pytest.approx(2 * one)
    with pytest.raises(KeyError, match="size 2"):
        score(Launch(2, 0, 4), [DECODE_HEAVY], PROFILES)
    assert score(Launch(4, 2, prefill=0), [PREFILL_HEAVY], PROFILES) == float("inf")  # nothing prefills


def test_prefill_on_small_engines_for_decode_on_large_ones_when_both_are_heavy():
    # colocated, each engine's steps carry its prefill and its decodes in turn; split, the small
    # engines prefill (at twice the large ones' rate a GPU) while the large ones decode
    both = Demand(15, 1.5e6, 400_000, 256, 2000, prefill_arrivals=1.5e6, turns=400, live=256, mean_response=400)
    cands = [Launch(1, 0, 8), Launch(4, 0, 2), Launch(4, 1, prefill=4, prefill_size=1), Launch(1, 4, prefill=1,
                                                                                                prefill_size=4)]
    ranked = plan(cands, [both], PROFILES, AllocatorConfig(response_kv_pushed=True))
    assert ranked[0][0] == Launch(4, 1, prefill=4, prefill_size=1)
    assert ranked[0][1] < 0.9 * min(s for c, s in ranked if c.prefill == 0)  # both colocated launches
    assert ranked[-1][0] == Launch(1, 4, prefill=1, prefill_size=4)  # the other way round: the worst


def test_ties_go_to_colocation_then_to_fewer_engines():
    flat = Capacity(step=[0.01, 0.0, 0.0, 0.0], chunk_tokens=2048, kv_tokens=1e9)
    nothing = Demand(horizon_s=15, prefill_tokens=0, decode_tokens=0, decode_seqs=0, mean_context=0)
    ranked = plan([Launch(1, 4, prefill=4), Launch(1, 0, 8), Launch(4, 0, 2)], [nothing], {1: flat, 4: flat})
    assert [c for c, _ in ranked] == [Launch(4, 0, 2), Launch(1, 0, 8), Launch(1, 4, prefill=4)]


def test_plan_refuses_no_demand_and_launches_of_different_sizes():
    with pytest.raises(ValueError, match="no demand"):
        plan([Launch(4, 0, 2)], [], PROFILES)
    with pytest.raises(ValueError, match="different GPU counts"):
        plan([Launch(4, 0, 2), Launch(1, 0, 4)], [DECODE_HEAVY], PROFILES)


def test_candidates_are_every_colocation_split_and_per_role_split_of_the_gpus():
    got = candidates(8, [1, 2, 4, 8])
    assert len(got) == len(set(got)) and all(c.gpus == 8 for c in got)
    colocated = [c for c in got if c.mixed]
    assert colocated == [Launch(1, 0, 8), Launch(2, 0, 4), Launch(4, 0, 2), Launch(8, 0, 1)]
    assert [c for c in got if c.prefill and not c.prefill_size and c.size == 2] == [
        Launch(2, 3, prefill=1), Launch(2, 2, prefill=2), Launch(2, 1, prefill=3)]
    assert Launch(4, 1, prefill=4, prefill_size=1) in got and Launch(1, 4, prefill=1, prefill_size=4) in got
    assert not any(c.prefill_size == 8 for c in got)  # 8 GPUs of prefill leave none to decode on
    assert candidates(6, [4]) == [] and candidates(6, [1, 4]) == [Launch(1, 0, 6), *(Launch(1, 6 - p, prefill=p)
                                                                                       for p in range(1, 6)),
                                                                  Launch(4, 1, prefill=2, prefill_size=1),
                                                                  Launch(1, 2, prefill=1, prefill_size=4)]
    many = candidates(128, [1, 2], most=3)
    assert sum(1 for c in many if c.prefill_size == 1 and c.size == 2) == 3
