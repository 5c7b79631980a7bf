"""`benchmarks/pd_two_sizes.py`: guided over every per-role launch against its roles as launched."""

from __future__ import annotations

from benchmarks.pd_two_sizes import cell_lines, report, run_seed


def test_every_per_role_launch_runs_static_and_guided_on_the_same_trajectories():
    r = run_seed("qwen2.5-32b", "math", "sync", 8, 0, [1, 4], 3)
    assert set(r["launches"]) == {"4P@tp1+1D@tp4", "1P@tp4+4D@tp1"}  # both ways round, all 8 GPUs each
    assert r["best_static"] == min(r["launches"], key=lambda k: r["launches"][k]["static_s"])
    for run in r["launches"].values():
        assert run["static_s"] > 0 and run["guided_s"] > 0 and run["moves"] >= 0
    cell = {"model": "qwen2.5-32b", "workload": "math", "mode": "sync", "gpus": 8, "seeds": [r]}
    lines = cell_lines(cell)
    assert len(lines) == 2 and sum("(best static)" in line for line in lines) == 1
    said: list[str] = []
    report([cell], 1.0, said.append)
    assert any(line.startswith("every per-role launch") and "cells   2" in line for line in said)
