"""A recorded batch (`rollout export`) as the simulator's workload."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.sim.cluster import Cluster, Policy
from benchmarks.sim.trace import trace_workload
from rollout_service.recording import read

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "benchmarks" / "sim" / "data" / "traces" / "textworld-smollm2-cpu.jsonl"


def test_the_episodes_are_the_recorded_ones():
    header, records = read(TRACE)
    wl = trace_workload(TRACE, time_scale=2.0, length_scale=3.0)
    ran = sorted((r for r in records if r.trajectory.turns),
                 key=lambda r: (r.trajectory.group_index, r.trajectory.sample_index))
    assert len(wl.recorded) == len(ran) > 0 and header.request.env == "textworld"
    assert any(len(r.trajectory.turns) > 1 for r in ran)  # multi-turn: observations and tool times matter
    for ep, rec in zip(wl.recorded, ran):
        turns = rec.trajectory.turns
        assert ep.env == "textworld" and ep.prompt == round(len(turns[0].prompt_ids) * 3.0)
        assert [t.response for t in ep.turns] == [max(round(len(t.output_ids) * 3.0), 1) for t in turns]
        assert [t.latency_s for t in ep.turns] == [t.timings.tool_s * 2.0 for t in turns]
        assert [t.observation for t in ep.turns[:-1]] == [round(len(t.prompt_ids) * 3.0) for t in turns[1:]]


def test_groups_stay_together_and_seeds_rotate_whole_groups():
    wl = trace_workload(TRACE)
    g = wl.group_of
    assert g == read(TRACE)[0].request.group_size > 1
    for seed in (0, 1, 2):
        eps = [wl.episode(seed, i, 0.0) for i in range(2 * len(wl.recorded))]
        for start in range(0, len(eps), g):
            members = eps[start:start + g]
            assert len({e.group for e in members}) == 1 and len({e.prompt for e in members}) == 1
    orders = {tuple(wl.episode(seed, i, 0.0).prompt for i in range(len(wl.recorded))) for seed in range(10)}
    assert len(orders) > 1  # another seed, another starting group


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_simulator_runs_every_recorded_turn(mode):
    wl = dataclasses.replace(trace_workload(TRACE, length_scale=20.0), per_gpu=4, rounds=2)
    r = Cluster(wl, 4, Policy.guided(), mode, seed=3).run()
    want = sum(len(wl.episode(3, i, 0.0).turns) for i in range(r.trajectories))
    assert r.trajectories == 4 * 4 * 2 and r.turns == want and r.makespan_s > 0
    again = Cluster(wl, 4, Policy.guided(), mode, seed=3).run()
    assert (again.makespan_s, again.turns) == (r.makespan_s, r.turns)


def test_pd_allocation_takes_a_trace(tmp_path):
    out = tmp_path / "pd.json"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "pd_allocation.py"), "--trace", str(TRACE),
                        "--trace-length-scale", "20", "--models", "llama3-8b-tp1", "--gpus", "4", "--modes", "async",
                        "--seeds", "0", "--scale", "0.125", "--out", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    cells = json.loads(out.read_text())["cells"]
    assert [c["workload"] for c in cells] == ["trace"] and cells[0]["seeds"][0]["trajectories"] > 0
    assert "trace" in p.stdout
