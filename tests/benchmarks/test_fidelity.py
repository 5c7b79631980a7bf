"""The fidelity replay (benchmarks/sim/fidelity.py) on the recording shipped in data/traces:
queue order, the per-turn overhead terms, the engines' contention and spread, and the figures'
bookkeeping."""

from __future__ import annotations

from pathlib import Path
from statistics import mean

import pytest

from benchmarks.sim import cpu_preset
from benchmarks.sim.fidelity import (FIGURES, Figures, Overhead, compare, contention, engine_spread, pct, real_figures,
                                     recorded_workload, simulate, spread_costs)
from rollout_service.recording import read

TRACE = Path(__file__).parents[2] / "benchmarks/sim/data/traces/textworld-smollm2-cpu.jsonl"


def test_the_workload_is_the_recording_in_queue_order():
    _, records = read(TRACE)
    records.sort(key=lambda r: (r.trajectory.group_index, r.trajectory.sample_index))
    wl = recorded_workload(TRACE, 4, 2)
    eps = [wl.episode(seed, i, 0.0) for seed in (0, 7) for i in range(len(records))]
    want = [len(r.trajectory.turns[0].prompt_ids) for r in records]
    assert [e.prompt for e in eps] == want * 2  # any seed: no rotation
    assert [t.latency_s for t in eps[0].turns] == [t.timings.tool_s for t in records[0].trajectory.turns]


def test_each_overhead_term_adds_its_time_to_every_turn():
    # One trajectory in flight on one engine: nothing overlaps, so each term shows whole.
    cost = cpu_preset.engine("smollm2")
    n_turns = sum(len(r.trajectory.turns) for r in read(TRACE)[1])
    base = simulate(recorded_workload(TRACE, 1, 1), 1, cost)
    over = Overhead(request_s=0.5, turn_s=0.25)
    more = simulate(recorded_workload(TRACE, 1, 1, over), 1, cost, over)
    assert more.makespan_s - base.makespan_s == pytest.approx(n_turns * 0.75, rel=1e-6)
    assert (more.prefill_mean_s, more.decode_mean_s) == pytest.approx((base.prefill_mean_s, base.decode_mean_s))
    assert more.busy_fraction < base.busy_fraction


def test_overhead_from_a_recording_is_what_no_turn_accounts_for():
    trajs = [r.trajectory for r in read(TRACE)[1]]
    over = Overhead.from_recording(trajs)
    t = trajs[0]
    accounted = sum(u.timings.queue_s + u.timings.prefill_s + u.timings.decode_s + u.timings.tool_s for u in t.turns)
    assert over.turn_s > 0 and accounted < t.active_s
    assert over.request_s == pytest.approx(mean(u.timings.queue_s for x in trajs for u in x.turns))


def test_figures_and_lines():
    assert pct([3, 1, 2], 0.5) == 2 and pct([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0.9) == 9
    trajs = [r.trajectory for r in read(TRACE)[1]]
    real = real_figures(trajs, 100.0, 0.5)
    assert real.trajectories == len(trajs) and real.makespan_s == 100.0
    lines = compare(real, real)
    assert [ln.name for ln in lines] == list(FIGURES) and all(ln.error_pct == 0 for ln in lines)
    assert lines[0].text("2e-c8/service ") == "fidelity 2e-c8/service makespan_s real=100 sim=100 error=+0.0%"


def test_contention_is_read_off_the_engine_time_per_turn():
    sim = Figures(10.0, 1.0, 2.0, prefill_mean_s=0.05, decode_mean_s=0.25, busy_fraction=0.9)
    real = Figures(10.0, 1.0, 2.0, prefill_mean_s=0.10, decode_mean_s=0.50, busy_fraction=0.9)
    assert contention(real, sim) == pytest.approx(2.0)  # (0.10 + 0.50) / (0.05 + 0.25)
    assert contention(sim, real) == 1.0  # never faster than the preset


def test_spread_measures_how_far_apart_the_engines_ran():
    trajs = [r.trajectory for r in read(TRACE)[1]]
    assert engine_spread(trajs) == 0.0  # the trace ran on one engine
    for i, t in enumerate(trajs):  # every other trajectory on a second engine, 3x as slow
        for u in t.turns:
            u.engine_id = f"e{i % 2}"
            if i % 2:
                u.timings.prefill_s, u.timings.decode_s = 0.3, 0.9
            else:
                u.timings.prefill_s, u.timings.decode_s = 0.1, 0.3
    assert engine_spread(trajs) == pytest.approx(0.5)  # (1.2 - 0.4) / (1.2 + 0.4)


def test_a_spread_slows_one_engine_and_speeds_the_other():
    cost = cpu_preset.engine("smollm2")
    base = cost.step_time(8, 8 * 500)
    slow, mid, fast = spread_costs(cost, 3, 0.2)
    assert [c.step_time(8, 8 * 500) / base for c in (slow, mid, fast)] == pytest.approx([1.2, 1.0, 0.8])
    assert spread_costs(cost, 1, 0.2) == [cost] and spread_costs(cost, 2, 0.0) == [cost, cost]
    even = simulate(recorded_workload(TRACE, 2, 2), 2, cost)
    apart = simulate(recorded_workload(TRACE, 2, 2), 2, cost, spread=0.2)
    assert (apart.trajectories, apart.turns) == (even.trajectories, even.turns)
    assert apart.decode_mean_s != even.decode_mean_s
