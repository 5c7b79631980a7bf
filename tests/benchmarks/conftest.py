"""A small pd_role_tp.py table, run once for the tests that read it (its own, and pd_launch.py's)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def role_tp_table(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """The 32B on 8 GPUs at TP2 and TP4, `math` sync, one seed, a quarter of the load: the run and its JSON."""
    out = tmp_path_factory.mktemp("role_tp") / "r.json"
    p = subprocess.run([sys.executable, "benchmarks/pd_role_tp.py", "--gpus", "8", "--seeds", "0", "--workloads",
                        "math", "--modes", "sync", "--tps", "2,4", "--base", "4", "--scale", "0.25", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    return p, out
