"""A weight update through the service: every engine paused, reloaded, versioned, resumed."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from env_workers.client import LocalEnvs
from rollout_service.engines.fleet import Fleet
from rollout_service.engines.sim import SimEngine
from rollout_service.engines.sim_server import create_app as sim_app
from rollout_service.rollout import run_episode
from scheduler.registry import Registry
from scheduler.store import Work
from tests.conftest import LiveServer
from trainer_client import RolloutClient, WeightUpdateError
from wire import EngineInfo, RolloutRequest, SamplingParams


def work(i: int) -> Work:
    params = RolloutRequest(tasks=[{}], env="math", sampling=SamplingParams(seed=5))
    return Work(f"w-{i}", "w", 0, 0, {"seed": 9}, params)


async def test_update_reaches_every_engine_and_labels_later_turns(gateway, redis, keys):
    engines = [LiveServer(sim_app(SimEngine(f"e{i}", seed=1))) for i in range(2)]
    reg = Registry(redis, keys)
    for i, srv in enumerate(engines):
        srv.__enter__()
        await reg.add_engine(EngineInfo(id=f"e{i}", url=srv.url))
    try:
        fleet = Fleet(registry=reg, refresh_s=0)
        before = await run_episode(work(0), fleet, LocalEnvs())
        assert before.turns[0].policy_version == 0

        with RolloutClient(gateway.url) as c:
            res = await asyncio.to_thread(c.update_weights, path="/checkpoints/step-1")
        assert res.version == 1 and [r.ok for r in res.results] == [True, True]
        assert {e.policy_version for e in await reg.engines()} == {1}

        after = await run_episode(work(0), fleet, LocalEnvs())
        assert after.turns[0].policy_version == 1
        assert after.turns[0].output_ids != before.turns[0].output_ids  # new weights, new output

        with RolloutClient(gateway.url) as c:
            lora = await asyncio.to_thread(c.update_weights, lora=("adapter-2", "/adapters/2"))
        assert lora.version == 2
        assert {e.model for e in await reg.engines()} == {"adapter-2"}  # requests now name the adapter
        await fleet.aclose()
    finally:
        for srv in engines:
            srv.__exit__(None, None, None)


def test_failed_engine_is_reported_not_versioned(gateway):
    with RolloutClient(gateway.url) as c:
        c.register_engine("dead", "http://127.0.0.1:9")
        with pytest.raises(WeightUpdateError) as e:
            c.update_weights(path="/ckpt")
        assert e.value.result.ok is False and e.value.result.results[0].engine_id == "dead"
        assert c.engines()[0]["policy_version"] == 0


def test_weight_update_validation(gateway):
    with httpx.Client(base_url=gateway.url) as c:
        for body in ({}, {"path": "/a", "lora": {"name": "x"}}, {"path": ""}, {"path": "/a", "lora_name": "a b"}):
            r = c.post("/v1/weights", json=body)
            assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"
        r = c.post("/v1/weights", json={"path": "/a", "engines": ["ghost"]})
        assert r.status_code == 404
