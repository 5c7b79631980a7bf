"""Allocator decisions on hand-built scenarios: what it picks, when it moves, and that it
does not flap."""

from __future__ import annotations

import random

from scheduler.allocator import Allocator, AllocatorConfig, Capacity, Layout
from scheduler.forecast import Demand
from scheduler.roles import EngineState, Role

IDS = [f"e{i}" for i in range(8)]


def additive() -> Capacity:
    """An engine whose colocated prefill fully stalls decode (interference = 1 / prefill rate)."""
    return Capacity(prefill_tok_s=20_000, step=[0.010, 1e-4, 4e-8, 5e-5])


PREFILL_HEAVY = Demand(horizon_s=15, prefill_tokens=2e6, decode_tokens=64_000, decode_seqs=64, mean_context=1000)
DECODE_ONLY = Demand(horizon_s=15, prefill_tokens=0, decode_tokens=64_000, decode_seqs=64, mean_context=1000)


def test_plan_decode_only_keeps_everything_mixed():
    a = Allocator(IDS, additive())
    lay, _ = a.plan(DECODE_ONLY)
    assert lay == Layout(0, 0, 8)


def test_plan_prefill_heavy_disaggregates_when_interference_is_high():
    a = Allocator(IDS, additive())
    lay, est = a.plan(PREFILL_HEAVY)
    assert lay.prefill >= 1
    assert est < 0.9 * a.estimate(Layout(0, 0, 8), PREFILL_HEAVY)


def test_plan_prefill_heavy_stays_mixed_when_prefill_overlaps_decode():
    cap = Capacity(prefill_tok_s=20_000, step=[0.010, 1e-4, 4e-8, 0.0])  # colocated prefill costs decode nothing
    lay, _ = Allocator(IDS, cap).plan(PREFILL_HEAVY)
    assert lay == Layout(0, 0, 8)


def test_split_pays_for_recompute_when_contexts_do_not_fit():
    cap = additive()
    a = Allocator(IDS, cap)
    fits = Demand(15, 2e5, 64_000, 64, 1000, turns=200, live=200, mean_response=300)
    spills = Demand(15, 2e5, 64_000, 64, 50_000, turns=200, live=200, mean_response=300)
    assert a.prefill_tokens(fits, 8, split=False) == 2e5  # everything cached on 8 engines
    assert a.prefill_tokens(fits, 2, split=True) == 2e5 + 200 * 300  # the last responses
    assert a.prefill_tokens(spills, 2, split=True) > a.prefill_tokens(spills, 8, split=False) > 2e5


def test_allocate_moves_when_gain_beats_cost_and_drains_first():
    a = Allocator(IDS, additive(), AllocatorConfig(dwell_s=30, max_moves=0.25))
    moves = a.allocate(PREFILL_HEAVY, {e: 0.0 for e in IDS}, now=60.0)
    assert 1 <= len(moves) <= 2  # at most a quarter of the cluster per decision
    assert all(m.new is Role.prefill for m in moves)
    for m in moves:
        assert a.engines[m.engine].state is EngineState.draining and m.engine not in a.roles()
    assert a.layout().prefill == len(moves)
    assert a.allocate(PREFILL_HEAVY, {}, now=61.0) == []  # nothing new moves while one drains
    for m in moves:
        assert a.drained(m.engine, 62.0) is Role.prefill
    assert sum(r is Role.prefill for r in a.roles().values()) == len(moves)


def test_allocate_holds_when_draining_costs_more_than_it_gains():
    a = Allocator(IDS, additive())
    assert a.allocate(PREFILL_HEAVY, {e: 1e4 for e in IDS}, now=60.0) == []
    assert a.allocate(PREFILL_HEAVY, {e: 0.0 for e in IDS}, now=60.0) != []


def test_allocate_respects_dwell():
    a = Allocator(IDS, additive(), AllocatorConfig(dwell_s=30))
    assert a.allocate(PREFILL_HEAVY, {}, now=10.0) == []  # every engine just started
    assert a.allocate(PREFILL_HEAVY, {}, now=31.0) != []


def _alternate(cfg: AllocatorConfig, seconds: float = 300.0) -> Allocator:
    """Demand flips between prefill-heavy and decode-only every 5 s; engines drain at once."""
    a = Allocator(IDS, additive(), cfg)
    t = 0.0
    while t < seconds:
        d = PREFILL_HEAVY if int(t / 5) % 2 == 0 else DECODE_ONLY
        for m in a.allocate(d, {}, t):
            a.drained(m.engine, t)
        t += 5.0
    return a


def test_hysteresis_does_not_flap():
    calm = _alternate(AllocatorConfig(dwell_s=60, margin=0.25))
    jumpy = _alternate(AllocatorConfig(dwell_s=0, margin=0.0, min_gain=0.0, switch_s=0.0))
    assert len(jumpy.history) > 2 * len(calm.history)
    last: dict[str, float] = {}
    for t, m in calm.history:  # no engine moves twice within the dwell time
        assert t - last.get(m.engine, -1e9) >= 60
        last[m.engine] = t


def test_never_drains_the_last_engine_of_a_kind():
    ids = ["a", "b"]
    a = Allocator(ids, additive(), AllocatorConfig(max_moves=1.0, dwell_s=0), initial=Layout(1, 1, 0))
    a.allocate(DECODE_ONLY, {}, now=1.0)  # wants both mixed, but both draining at once would serve nothing
    roles = a.roles().values()
    assert any(r.prefills for r in roles) and any(r.decodes for r in roles)


def test_capacity_fit_recovers_measured_step_times():
    true = [0.015, 2e-4, 6e-8, 2e-5]
    cap = Capacity(step=[0.010, 1e-4, 4e-8, 5e-5], ridge=5.0)
    rng = random.Random(0)
    for _ in range(4096):
        b, ctx, k = rng.randint(1, 256), rng.uniform(0, 4e5), rng.choice([0, 0, 2048, rng.uniform(0, 2048)])
        y = true[0] + true[1] * b + true[2] * ctx + true[3] * k
        cap.observe_step(b, ctx, k, y * rng.uniform(0.97, 1.03))
    for got, want in zip(cap.step, true):
        assert abs(got - want) < 0.1 * want, (cap.step, true)
    cap.observe_prefill(10_000, 1.0)
    assert cap.prefill_tok_s < 20_000
