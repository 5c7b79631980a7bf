"""Record and replay against a real vLLM CPU server (SmolLM2): episodes run by the rollout loop
replay on the environment side, and re-sampled on the same engine with the same seeds give
back the sampled ids. (Export through the gateway is tested with the simulated engine, in
tests/rollout_service/test_recording.py; here the loop runs directly, with no leases to lose
on a loaded machine.)"""

from __future__ import annotations

import pytest

from env_workers.client import LocalEnvs
from env_workers.resources import Pools
from rollout_service.engines.fleet import Fleet
from rollout_service.engines.vllm import VLLMEngine
from rollout_service.recording import record
from rollout_service.replay import REPLAY_POOL, replay
from rollout_service.resample import resample
from rollout_service.rollout import run_episode
from scheduler.store import Work
from wire import RolloutRequest, SamplingParams

pytestmark = pytest.mark.integration


async def test_a_vllm_recording_replays_and_resamples(vllm_server):
    task = {"seed": 1, "level": 1}
    request = RolloutRequest(tasks=[task], env="textworld", group_size=2, max_turns=2,
                             sampling=SamplingParams(temperature=1.0, max_tokens=24, seed=3))
    engine = VLLMEngine("vllm-0", vllm_server.url, vllm_server.name)
    fleet = Fleet({"vllm-0": (engine, str(vllm_server.model_dir))})
    params = request.model_copy(update={"tasks": [{}]})
    records = []
    for sample in range(2):  # one at a time: each request ran alone on the engine, as its replay will
        traj = await run_episode(Work(f"b-0-{sample}", "b", 0, sample, task, params), fleet, LocalEnvs())
        assert traj.turns and traj.failure is None, traj.failure
        records.append(record(traj, request))

    pools = Pools(REPLAY_POOL)
    try:
        assert [replay(r, pools).outcome for r in records] == ["match", "match"]
    finally:
        pools.close()

    verdicts = await resample(records, request, engine, concurrency=1)
    await fleet.aclose()
    assert len(verdicts) == sum(len(r.trajectory.turns) for r in records)
    diverged = [v for v in verdicts if v.diverged]
    assert not diverged, f"{len(diverged)} of {len(verdicts)} turns diverged: {diverged}"
