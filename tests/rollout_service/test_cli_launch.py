"""`rollout launch-plan`: launches ranked from what the allocator recorded, as an operator runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from rollout_service.cli.launch import current_launch
from scheduler.allocator import Capacity
from scheduler.launch import Launch
from scheduler.forecast import Demand
from scheduler.registry import Registry
from tests.conftest import REDIS_URL
from wire import EngineInfo

# engines of 4 GPUs decode 4x the sequences in about half the step time of engines of 1 GPU
# (`tests/scheduler/test_launch.py`): a decode-heavy phase wants the large ones
SMALL = Capacity(step=[0.004, 2e-5, 1e-8, 8e-5], chunk_tokens=2048, kv_tokens=100_000)
LARGE = Capacity(step=[0.0015, 5e-6, 2.5e-9, 4e-5], chunk_tokens=2048, kv_tokens=700_000)
DECODE_HEAVY = Demand(15, 20_000, 400_000, 256, 2000, prefill_arrivals=20_000, turns=200, live=256, mean_response=400)


def _run(prefix: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.getcwd(), COLUMNS="200", ROLLOUT_REDIS_URL=REDIS_URL,
               ROLLOUT_KEY_PREFIX=prefix)
    return subprocess.run([sys.executable, "-m", "rollout_service.cli", "launch-plan", *args], capture_output=True,
                          text=True, env=env, timeout=120)


async def test_ranks_launches_from_the_recorded_phase_beside_the_one_running(redis, keys, prefix):
    reg = Registry(redis, keys)
    for i in range(8):  # running now: 8 colocated engines of 1 GPU
        await reg.add_engine(EngineInfo(id=f"e{i}", url=f"http://127.0.0.1:9/e{i}", model="m"))
    out = _run(prefix)
    assert out.returncode != 0 and "no engine size measured for 'm'" in out.stderr
    await reg.save_profile("m", 1, SMALL)
    await reg.save_profile("m", 4, LARGE)
    out = _run(prefix)
    assert out.returncode != 0 and "no demand recorded" in out.stderr
    for _ in range(3):
        await reg.record_phase(DECODE_HEAVY)

    out = _run(prefix)
    assert out.returncode == 0, out.stderr
    assert "m on 8 GPUs: 3 decisions of demand" in out.stdout
    first = next(line for line in out.stdout.splitlines() if line.strip().startswith("│ 1"))
    assert "2 colocated x 4 GPU" in first
    assert "8 colocated x 1 GPU  (now)" in out.stdout and "1.00x" in out.stdout

    got = json.loads(_run(prefix, "--json", "--top", "3").stdout)
    assert got["model"] == "m" and got["gpus"] == 8 and got["decisions"] == 3 and len(got["ranked"]) == 3
    assert got["ranked"][0] == {**got["ranked"][0], "size": 4, "mixed": 2, "prefill": 0, "decode": 0}
    assert got["current"]["launch"] == "8 colocated x 1 GPU"
    assert got["current"]["seconds"] / got["ranked"][0]["seconds"] > 1.4  # the large engines: faster by the model
    every = json.loads(_run(prefix, "--json", "--top", "100").stdout)["ranked"]
    assert any(r["prefill_size"] != r["size"] and r["prefill"] for r in every)  # per-role launches were ranked
    assert all(r["prefill"] * r["prefill_size"] + (r["decode"] + r["mixed"]) * r["size"] == 8 for r in every)

    out = _run(prefix, "--gpus", "6")
    assert out.returncode == 0 and "m on 6 GPUs" in out.stdout and "6 colocated x 1 GPU" in out.stdout
    assert "not scored" in out.stdout  # the engines now use 8 GPUs: no ratio against them
    out = _run(prefix, "--model", "other")
    assert out.returncode != 0 and "no engine size measured for 'other'" in out.stderr


def test_gpu_counts_are_checked_before_anything_runs(prefix):
    for args in (["launch-plan", "--gpus", "0"], ["engines", "add", "e0", "http://127.0.0.1:9", "--gpus", "-2"],
                 ["up", "--engine-gpus", "four"]):
        out = subprocess.run([sys.executable, "-m", "rollout_service.cli", *args], capture_output=True, text=True,
                             env=dict(os.environ, PYTHONPATH=os.getcwd()), timeout=60)
        assert out.returncode == 2 and ("1 to 4096 GPUs" in out.stderr or "whole number" in out.stderr), out.stderr


def test_the_running_launch_is_read_off_the_engines():
    def engines(*spec):
        return [EngineInfo(id=f"e{i}", url="http://127.0.0.1:9", model="m", gpus=g, role=r) for i, (g, r) in
                enumerate(spec)]

    assert current_launch(engines((4, "mixed"), (4, "mixed")), "m") == Launch(4, 0, 2)
    # a split at one size reads as the planner's own split (the same candidate, marked "now")
    assert current_launch(engines((4, "prefill"), (4, "decode")), "m") == Launch(4, 1, prefill=1)
    assert current_launch(engines((1, "prefill"), (1, "prefill"), (4, "decode")), "m") == Launch(
        4, 1, prefill=2, prefill_size=1)
    assert current_launch(engines((1, "mixed"), (4, "decode")), "m") is None  # no launch of ours is that
    assert current_launch(engines((4, "mixed")), "other") is None
