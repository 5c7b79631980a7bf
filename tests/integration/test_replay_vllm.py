"""Record and replay against a real vLLM CPU server (SmolLM2): a batch recorded through the
service replays on the environment side, and re-sampled on the same engine with the same
seeds gives back the sampled ids."""

from __future__ import annotations

import asyncio

import pytest

from env_workers.resources import Pools
from rollout_service.cli import main
from rollout_service.engines.vllm import VLLMEngine
from rollout_service.recording import read
from rollout_service.replay import REPLAY_POOL, replay
from rollout_service.resample import resample
from scheduler.registry import Registry
from tests.conftest import RunningWorker
from trainer_client import RolloutClient
from wire import EngineInfo

pytestmark = pytest.mark.integration


async def test_a_vllm_recording_replays_and_resamples(vllm_server, gateway, settings, redis, keys, tmp_path):
    await Registry(redis, keys).add_engine(EngineInfo(id="vllm-0", url=vllm_server.url, model=vllm_server.name,
                                                      tokenizer=str(vllm_server.model_dir)))
    # One trajectory at a time, so that each request ran alone on the engine, as its replay will.
    with RunningWorker(settings, discover=True, concurrency=1), RolloutClient(gateway.url) as c:
        batch = await asyncio.to_thread(c.submit, [{"seed": 1, "level": 1}], env="textworld", group_size=2,
                                        sampling={"temperature": 1.0, "max_tokens": 24, "seed": 3}, max_turns=2)
        await asyncio.to_thread(lambda: list(c.iter_results(batch.id)))
    out = tmp_path / "rec.jsonl"
    await asyncio.to_thread(main, ["export", batch.id, "-o", str(out), "--url", gateway.url])
    header, records = read(out)
    assert len(records) == 2 and all(r.trajectory.turns for r in records)

    pools = Pools(REPLAY_POOL)
    try:
        assert [replay(r, pools).outcome for r in records] == ["match", "match"]
    finally:
        pools.close()

    engine = VLLMEngine("again", vllm_server.url, vllm_server.name)
    try:
        verdicts = await resample(records, header.request, engine, concurrency=1)
    finally:
        await engine.aclose()
    assert len(verdicts) == sum(len(r.trajectory.turns) for r in records)
    diverged = [v for v in verdicts if v.diverged]
    assert not diverged, f"{len(diverged)} of {len(verdicts)} turns diverged: {diverged}"
