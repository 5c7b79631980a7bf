"""`benchmarks/sim/pypy.py`: a cell run under PyPy writes every number CPython writes."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# a MoE cell on two DP8 engines: the allocator moves engines in it (the cold start, from colocation)
CELL = ["--models", "qwen3-30b-a3b-dp8ep8", "--gpus", "16", "--workloads", "web", "--modes", "sync", "--seeds", "0"]


def run(python: str, out: Path) -> dict:
    subprocess.run([python, "benchmarks/sim/pypy.py", "benchmarks/pd_allocation.py", *CELL, "--out", str(out)],
                   cwd=ROOT, check=True, capture_output=True, timeout=900)
    return json.loads(out.read_text())


def test_pypy_writes_the_numbers_cpython_writes(tmp_path):
    pypy = shutil.which("pypy3")
    assert pypy, "pypy3 is not installed (apt install pypy3; .ci/run installs it)"
    implementation = subprocess.run([pypy, "-c", "import sys; print(sys.implementation.name)"],
                                    capture_output=True, text=True, check=True).stdout.strip()
    assert implementation == "pypy"
    a, b = run(sys.executable, tmp_path / "cpython.json"), run(pypy, tmp_path / "pypy.json")
    (ca,), (cb,) = a["cells"], b["cells"]
    assert ca["seeds"][0]["guided_cold_moves"] > 0  # the allocator's moves are part of what is compared
    assert ca["seeds"] == cb["seeds"]
    assert ca["summary"] == cb["summary"]
