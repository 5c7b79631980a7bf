"""The simulator-fidelity pipeline end to end, small: a real batch through `rollout up` on the
session's vLLM CPU server, its recording, the recording simulated with the CPU preset, the
report lines. Nothing here asserts a timing (benchmarks/sim_fidelity.py measures those); it
asserts that the simulation ran the very workload the service ran."""

from __future__ import annotations

import math
import re

import pytest

from benchmarks.sim import cpu_preset
from benchmarks.sim.fidelity import FIGURES, compare, recorded_workload
from benchmarks.sim_fidelity import fidelity_run, start_service
from rollout_service.recording import read
from tests.conftest import REDIS_URL
from tests.e2e.test_up import stop_up

pytestmark = pytest.mark.integration


def test_a_real_batch_is_recorded_simulated_and_reported(vllm_server, tmp_path):
    up, gw = start_service(REDIS_URL, [vllm_server.url], vllm_server.name, str(vllm_server.model_dir), 4)
    try:
        res = fidelity_run(gw, [vllm_server.url], vllm_server.name, concurrency=4, trajectories=4, turns=2,
                           max_tokens=6, recording=tmp_path / "batch.jsonl", seed=1)
    finally:
        stop_up(up)

    _, records = read(tmp_path / "batch.jsonl")
    recorded_turns = [len(r.trajectory.turns) for r in records]
    assert len(records) == 4 and all(1 <= n <= 2 for n in recorded_turns)
    wl = recorded_workload(tmp_path / "batch.jsonl", 4, 1)
    # the simulated episodes are the recorded ones, in queue order
    assert [len(wl.episode(0, i, 0.0).turns) for i in range(4)] == recorded_turns
    assert [e.prompt for e in wl.recorded] == [len(r.trajectory.turns[0].prompt_ids) for r in records]
    for label in ("engine", "service", "loaded"):
        sim = res[label]
        assert (sim.trajectories, sim.turns) == (4, sum(recorded_turns))
    assert res["real"].turns == sum(recorded_turns)
    over = res["overhead"]
    assert over.request_s >= 0 and over.turn_s >= 0 and res["contention"] >= 1

    lines = [ln.text() for ln in compare(res["real"], res["service"])]
    assert [ln.split()[1] for ln in lines] == list(FIGURES)
    for ln in lines:
        m = re.fullmatch(r"fidelity (\w+) real=(\S+) sim=(\S+) error=([+-]\S+)%", ln)
        assert m, ln
        assert all(math.isfinite(float(x)) and float(x) >= 0 for x in m.group(2, 3)), ln
    assert cpu_preset.preset().name == "cpu"
