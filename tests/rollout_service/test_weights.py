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


def test_an_engine_whose_load_fails_with_a_500_is_resumed_not_left_paused(gateway):
    """vLLM answers a failed `reload_weights` (a path it cannot read) with a 500 from an exception
    and closes that connection; the resume went out on it, failed as "server disconnected", and
    was let pass: the engine stayed paused, every request on it frozen for good. A server that
    behaves the same way here: the load fails, reported, and the engine is resumed."""
    from fastapi import FastAPI

    app, paused = FastAPI(), {"now": False, "resumes": 0}

    @app.post("/pause")
    async def pause() -> dict:
        paused["now"] = True
        return {}

    @app.post("/collective_rpc")
    async def reload() -> dict:
        raise RuntimeError("Repo id must use alphanumeric chars")  # uvicorn: a 500, and the connection closed

    @app.post("/resume")
    async def resume() -> dict:
        paused.update(now=False, resumes=paused["resumes"] + 1)
        return {}

    with LiveServer(app) as engine, RolloutClient(gateway.url) as c:
        c.register_engine("e0", engine.url)
        with pytest.raises(WeightUpdateError) as e:
            c.update_weights(path="/nonexistent")
        assert "collective_rpc answered 500" in e.value.result.results[0].error
        assert paused == {"now": False, "resumes": 1}
        assert c.engines()[0]["policy_version"] == 0


def test_a_relative_checkpoint_path_that_exists_here_goes_to_the_engines_absolute(gateway, tmp_path, monkeypatch):
    """`update_weights(path="ckpt/step-1")`, as a trainer writes it, went to vLLM as given: read
    from the engine's own folder, or taken for a model hub name, the load failed (and vLLM's failed
    in-place load leaves it without usable weights until it restarts). One that exists here goes
    absolute; one that does not (a hub name, a path only the engines see) goes as given."""
    (tmp_path / "ckpt" / "step-1").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    with LiveServer(sim_app(SimEngine("e0"))) as engine, RolloutClient(gateway.url) as c:
        c.register_engine("e0", engine.url)
        c.update_weights(path="ckpt/step-1")
        assert c.engines()[0]["weights"]["path"] == str(tmp_path / "ckpt" / "step-1")
        c.update_weights(lora=("a", "ckpt/step-1"))
        w = c.engines()[0]["weights"]
        assert (w["path"], w["lora_name"]) == (str(tmp_path / "ckpt" / "step-1"), "a") and w["engine_started_at"] > 0
        c.update_weights(path="org/model-on-a-hub")
        assert c.engines()[0]["weights"]["path"] == "org/model-on-a-hub"
