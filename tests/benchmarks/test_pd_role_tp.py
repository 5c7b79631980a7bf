"""benchmarks/pd_role_tp.py: per-role TP layouts, and the base TP's runs as pd_allocation.py's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks import pd_allocation, pd_role_tp
from benchmarks.sim.cost import PRESETS
from scheduler.launch import role_splits

ROOT = Path(__file__).resolve().parents[2]


def test_per_role_splits_use_every_gpu_with_both_roles():
    assert role_splits(8, 1, 2, 6) == [(2, 3), (4, 2), (6, 1)]
    assert role_splits(8, 4, 2, 6) == [(1, 2)]
    assert role_splits(8, 8, 1, 6) == []  # no GPU left to decode on
    assert role_splits(32, 8, 16, 6) == [(2, 1)]  # the MoE: DP8 groups prefilling for a DP16 group
    many = role_splits(128, 1, 2, 6)
    assert 1 < len(many) <= 6 and all(p + 2 * d == 128 and p >= 1 and d >= 1 for p, d in many)


def test_the_base_tp_runs_are_pd_allocations():
    base = pd_allocation.run_seed("coding", "async", 4, 0, PRESETS["qwen2.5-32b-tp2"](), 0.25)
    mine = pd_role_tp.run_seed("qwen2.5-32b", "coding", "async", 8, 0, [2, 4], [2], 6, 0.25)
    assert mine["uniform"]["colocated@tp2"] == base["colocated_s"]
    assert [mine["uniform"][f"{p}P{4 - p}D@tp2"] for p in (1, 2, 3)] == [base["statics"][f"static-{p}P"]
                                                                          for p in (1, 2, 3)]
    assert mine["guided"]["guided@tp2"] == base["guided_s"]
    assert set(mine["per_role"]) == {"1P@tp4+2D@tp2", "2P@tp2+1D@tp4"}
    assert mine["best_per_role_s"] == min(mine["per_role"].values())


def test_the_moe_sizes_are_its_dp_groups_and_its_base_runs_pd_allocations():
    base = pd_allocation.run_seed("web", "async", 2, 0, PRESETS["qwen3-30b-a3b-dp8ep8"](), 0.25)
    mine = pd_role_tp.run_seed("qwen3-30b-a3b", "web", "async", 16, 0, [8, 16], [8], 6, 0.25)
    assert mine["uniform"]["colocated@dp8"] == base["colocated_s"] and mine["guided"]["guided@dp8"] == base["guided_s"]
    assert mine["uniform"]["1P1D@dp8"] == base["statics"]["static-1P"]
    assert set(mine["uniform"]) == {"colocated@dp8", "1P1D@dp8", "colocated@dp16"} and mine["per_role"] == {}


def test_the_script_prints_a_line_per_cell_and_writes_json(tmp_path, role_tp_table):
    p, out = role_tp_table
    assert p.returncode == 0, p.stderr
    assert "math   sync    8 GPUs: best uniform" in p.stdout and "guided@tp4 over best per-role" in p.stdout
    cell = json.loads(out.read_text())["cells"][0]
    assert cell["gpus"] == 8 and cell["seeds"][0]["in_flight"] == 64 * 8 // 4
    joined, table = tmp_path / "j.json", tmp_path / "j.txt"
    again = subprocess.run([sys.executable, "benchmarks/pd_role_tp.py", "--render", f"{out},{out}",
                            "--out", str(joined), "--table", str(table)],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    assert len(json.loads(joined.read_text())["cells"]) == 2 and table.read_text().count("math   sync    8 GPUs") == 2
    rejoined = tmp_path / "jj.json"  # a joined file joins again, its parts kept
    again = subprocess.run([sys.executable, "benchmarks/pd_role_tp.py", "--render", f"{joined},{out}",
                            "--out", str(rejoined)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    assert len(json.loads(rejoined.read_text())["parts"]) == 3 and len(json.loads(rejoined.read_text())["cells"]) == 3
    bad = subprocess.run([sys.executable, "benchmarks/pd_role_tp.py", "--base", "3"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--base must be among --tps" in bad.stderr
    bad = subprocess.run([sys.executable, "benchmarks/pd_role_tp.py", "--model", "qwen3-30b-a3b", "--tps", "8,12",
                          "--base", "8"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "DP-attention groups of 8" in bad.stderr
