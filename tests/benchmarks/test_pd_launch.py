"""benchmarks/pd_launch.py: the launch picked from the phase before, read against pd_role_tp's table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import pd_launch, pd_role_tp
from benchmarks.sim.cost import ClusterCost
from benchmarks.sim.shape import MODELS
from scheduler.launch import Launch, candidates

ROOT = Path(__file__).resolve().parents[2]


def test_launch_names_of_the_table_parse():
    assert pd_role_tp.launch_of("colocated@tp4", 8) == Launch(4, 0, 2)
    assert pd_role_tp.launch_of("3P5D@tp1", 8) == Launch(1, 5, prefill=3)
    assert pd_role_tp.launch_of("4P@tp1+1D@tp4", 8) == Launch(4, 1, prefill=4, prefill_size=1)
    assert pd_role_tp.launch_of("2P@dp8+1D@dp16", 32) == Launch(16, 1, prefill=2, prefill_size=8)
    assert pd_role_tp.launch_of("12P@tp1+5D@tp4", 32).gpus == 32
    with pytest.raises(ValueError):
        pd_role_tp.launch_of("guided@tp4", 8)


def test_the_phase_before_is_measured_at_each_size():
    got = pd_launch.measure_phase("qwen2.5-32b", "math", "sync", 8, 0, [2, 4], in_flight=64)
    for size, (cap, demands) in got.items():
        assert cap.samples > 0 and demands  # fitted to that size's own steps; a forecast each decision
        assert cap.kv_tokens == ClusterCost.dense(MODELS["qwen2.5-32b"], size).kv_capacity_tokens
    assert got[4][0].step != got[2][0].step
    same = pd_launch.measure_phase("qwen2.5-32b", "math", "sync", 8, 0, [4], in_flight=64, offset=0)
    assert same[4][1] != got[4][1]  # offset 0: this phase itself (hindsight), not the one before


def test_the_script_picks_a_launch_of_the_table(tmp_path, role_tp_table):
    p, table = role_tp_table
    assert p.returncode == 0, p.stderr
    out, txt = tmp_path / "l.json", tmp_path / "l.txt"
    p = subprocess.run([sys.executable, "benchmarks/pd_launch.py", "--table-json", str(table), "--out", str(out),
                        "--table", str(txt)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "math   sync    8 GPUs: best" in p.stdout and "measured@tp4:" in p.stdout and "over guided" in p.stdout
    assert "qwen2.5-32b at 8 GPUs, 1 cells, measured@tp4: of the best launch" in txt.read_text()
    src = json.loads(table.read_text())["cells"][0]["seeds"][0]
    run = json.loads(out.read_text())["cells"][0]["seeds"][0]
    launches = {**src["uniform"], **src["per_role"]}
    # the table ran exactly the launches the live planner ranks (`rollout launch-plan`)
    assert {pd_role_tp.launch_of(n, 8) for n in launches} == set(candidates(8, [2, 4], 6))
    assert set(run["picks"]) == {"measured@tp4", "kept@tp4", "calibrated@tp4"}
    kept, measured = run["picks"]["kept@tp4"], run["picks"]["measured@tp4"]
    assert kept["launch"] == (measured["launch"] if measured["estimated_gain"] >= 1 / 0.9 else "colocated@tp4")
    for pick in run["picks"].values():
        assert launches[pick["launch"]] == pick["makespan_s"] >= run["best_s"] == min(launches.values())
        assert pick["decisions"] > 0
    assert run["colocated"]["tp4"] == src["uniform"]["colocated@tp4"] and run["guided"]["tp4"] == src["guided"]["guided@tp4"]
    p = subprocess.run([sys.executable, "benchmarks/pd_launch.py", "--table-json", str(table), "--models", "llama3-8b",
                        "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "no cell of the table matches" in p.stderr
