"""The allocator's calibration against the simulator: held runs keep the decisions it scores."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

from benchmarks.pd_estimate import estimated, judge
from benchmarks.sim.cluster import Cluster, Policy
from benchmarks.sim.workload import WORKLOADS
from scheduler.allocator import Layout
from scheduler.capacity import Capacity
from scheduler.forecast import Demand

ROOT = Path(__file__).resolve().parents[2]


def _held(perfect: bool) -> tuple[Cluster, float]:
    wl = dataclasses.replace(WORKLOADS["web"], per_gpu=4, rounds=2)
    colo = Cluster(wl, 4, Policy.colocated(), "async", seed=2).run()
    c = Cluster(wl, 4, Policy.held(perfect), "async", seed=2)
    return c, c.run().makespan_s / colo.makespan_s


def test_a_held_run_is_colocated_and_keeps_every_decisions_inputs():
    for perfect in (False, True):
        c, ratio = _held(perfect)
        assert ratio == 1.0 and not c.allocator.history  # it ran colocated, to the last digit, and never moved
        assert len(c.decisions) > 10
        for now, demand, capacity in c.decisions:
            assert isinstance(demand, Demand) and isinstance(capacity, Capacity)
            assert capacity is not c.capacity  # a copy: the fit as it was at that decision
        assert any(d.live for _, d, _ in c.decisions)
        # the true demand is told as such (nothing left to learn); the forecast counts what it learned
        assert all((d.observed == 1 << 30) == perfect for _, d, _ in c.decisions)


def test_the_estimate_is_summed_over_decisions_relative_to_colocated():
    c, _ = _held(False)
    lays = [Layout(0, 0, 4), Layout(1, 3, 0), Layout(3, 1, 0)]
    est = estimated(c, lays)
    assert est[lays[0]] == 1.0
    assert all(math.isfinite(v) and v > 0 for v in est.values())
    # web's long observations on 4 engines: each split scores slower than colocated (as it runs)
    assert est[lays[1]] > 1.0 and est[lays[2]] > 1.0


def test_the_closed_loop_estimate_runs_closer_to_the_simulator_where_tools_pace_the_loop():
    """web on 4 dense engines: the default prices a lone prefill (or decode) engine ~40% slow where
    it runs 2-3% slow; the closed-loop estimate, from the turns the held run measured, comes closer."""
    c, _ = _held(False)
    wl = dataclasses.replace(WORKLOADS["web"], per_gpu=4, rounds=2)
    colo = Cluster(wl, 4, Policy.colocated(), "async", seed=2).run().makespan_s
    lays = [Layout(0, 0, 4)] + [Layout(p, 4 - p, 0) for p in (1, 2, 3)]
    sim = {lay: Cluster(wl, 4, Policy.static(lay.prefill), "async", seed=2).run().makespan_s / colo
           for lay in lays[1:]}
    assert any(d.turn_response > 0 and d.tool_s > 0 for _, d, _ in c.decisions)  # the measured turns it reads

    def err(est: dict) -> float:
        return sum(abs(math.log(est[lay] / sim[lay])) for lay in sim) / len(sim)

    assert err(estimated(c, lays, "closed_loop")) < 0.7 * err(estimated(c, lays))


def test_judge_scores_the_estimates_first_choice_by_what_it_runs_at():
    sim = {0: 1.0, 1: 0.9, 2: 1.2}
    errs, got = judge(sim, {0: 1.0, 1: 1.1, 2: 1.2})  # it picks colocated, which runs 1/0.9 of the best
    assert got == 1.0 / 0.9
    assert sorted(round(e, 6) for e in errs) == [0.0, round(math.log(1.1 / 0.9), 6)]
    assert judge(sim, {0: 1.0, 1: 0.95, 2: 0.97})[1] == 1.0  # it picks the best


def test_bad_arguments_are_usage_errors():
    for args, said in ((["--models", "nope"], "unknown model 'nope'"), (["--modes", "both"], "unknown mode 'both'"),
                       (["--gpus", "eight"], "whole numbers")):
        p = subprocess.run([sys.executable, "benchmarks/pd_estimate.py", *args, "--out", "/dev/null"],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert p.returncode == 2 and said in p.stderr, p.stderr


def test_a_small_run_writes_every_split_with_every_estimate(tmp_path):
    out = tmp_path / "est.json"
    p = subprocess.run([sys.executable, "benchmarks/pd_estimate.py", "--models", "qwen2.5-32b-tp2", "--gpus", "8",
                        "--workloads", "math", "--modes", "sync", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "qwen2.5-32b-tp2 (forecast): a split's estimate / simulated" in p.stdout
    assert "its first choice within 2% of the best in 1/1 cell-seeds" in p.stdout
    (cell,) = json.loads(out.read_text())["cells"]
    (run,) = cell["seeds"]
    assert cell["engines"] == 4 and run["simulated"]["0"] == 1.0
    for key in ("forecast", "true_demand", "closed_loop"):
        assert set(run[key]) == {"0", "1", "2", "3"} and run[key]["0"] == 1.0
        assert all(math.isfinite(v) and v > 0 for v in run[key].values())
