"""The env worker over real HTTP, and its registration in Redis."""

from __future__ import annotations

import time

import httpx
import pytest
import redis.asyncio as aioredis

from env_workers.client import EnvRejected, RemoteEnvs
from env_workers.server import create_app
from scheduler.registry import Registry
from tests.conftest import REDIS_URL, LiveServer
from wire import WorkerInfo


@pytest.fixture
def env_server():
    with LiveServer(create_app(max_sessions=2)) as srv:
        yield srv


def test_session_lifecycle(env_server):
    with httpx.Client(base_url=env_server.url) as c:
        opened = c.post("/v1/sessions", json={"env": "calc", "task": {"seed": 1}}).json()
        assert opened["observation"][0]["role"] == "system"
        sid = opened["session_id"]
        r = c.post(f"/v1/sessions/{sid}/step", json={"action": "calc: 2 * 21"}).json()
        assert r["observation"][0]["content"] == "result: 42" and r["terminated"] is False
        assert c.delete(f"/v1/sessions/{sid}").status_code == 200
        gone = c.post(f"/v1/sessions/{sid}/step", json={"action": "x"})
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "not_found"



def test_an_inline_env_is_served_on_the_loop_and_any_other_in_a_thread(env_server, probe_envs):
    """As in-process (`LocalEnvs`): an `EnvSpec.inline` env's calls skip the thread pool."""
    with httpx.Client(base_url=env_server.url) as c:
        for name in probe_envs:
            opened = c.post("/v1/sessions", json={"env": name, "task": {"question": "1+1?", "answer": 2}})
            sid = opened.json()["session_id"]
            assert c.post(f"/v1/sessions/{sid}/step", json={"action": "answer: 2"}).json()["reward"] == 1.0
            assert c.delete(f"/v1/sessions/{sid}").status_code == 200
    assert probe_envs == {"probe-inline": [True, True], "probe-threaded": [False, False]}

def test_errors_use_one_shape(env_server):
    with httpx.Client(base_url=env_server.url) as c:
        unknown = c.post("/v1/sessions", json={"env": "nope", "task": {}})
        assert unknown.status_code == 404 and "unknown environment" in unknown.json()["error"]["message"]
        bad_task = c.post("/v1/sessions", json={"env": "math", "task": {"x": 1}})
        assert bad_task.status_code == 422 and bad_task.json()["error"]["code"] == "env_error"
        invalid = c.post("/v1/sessions", json={"env": 3})
        assert invalid.status_code == 422 and invalid.json()["error"]["code"] == "invalid_request"


def test_session_cap_is_backpressure(env_server):
    with httpx.Client(base_url=env_server.url) as c:
        for _ in range(2):
            assert c.post("/v1/sessions", json={"env": "math", "task": {"seed": 1}}).status_code == 200
        over = c.post("/v1/sessions", json={"env": "math", "task": {"seed": 1}})
        assert over.status_code == 429 and over.json()["error"]["code"] == "overloaded"


async def test_a_reward_that_is_not_a_finite_number_is_the_envs_failure_over_http_too(env_server):
    """Served, a NaN reward went out as null, and the rollout worker's parse of the reply failed:
    the trajectory was blamed on us (`internal`). Now the env worker says what its env did."""
    from env_workers.client import EnvUnavailable
    from env_workers.registry import EnvSpec, names, register
    from tests.rollout_service.test_rollout import NanReward

    if "nan_reward" not in names():
        register(EnvSpec("nan_reward", NanReward, "test: a NaN reward", example_tasks=[{}]))
    envs = RemoteEnvs(lambda env: _at(env_server.url))
    h, _ = await envs.open("nan_reward", {}, None)
    with pytest.raises(EnvUnavailable, match="reward of nan, not a finite number"):
        await envs.step(h, "anything")
    await envs.aclose()


async def _at(url: str) -> str:
    return url


async def test_remote_envs_client(env_server):
    async def pick(env):
        return env_server.url

    envs = RemoteEnvs(pick)
    h, obs = await envs.open("math", {"question": "1+1?", "answer": 2}, None)
    r = await envs.step(h, "answer: 2")
    assert r.terminated and r.reward == 1.0
    with pytest.raises(EnvRejected):
        await envs.open("math", {"bad": 1}, None)
    await envs.close(h)
    await envs.aclose()


async def test_worker_registers_and_drops_out_when_stopped(keys, redis):
    info = WorkerInfo(id="env-t", url="http://x", envs=["math", "calc"])
    reg = Registry(redis, keys)
    with LiveServer(create_app(registration=(Registry(aioredis.from_url(REDIS_URL), keys), info))):
        deadline = time.monotonic() + 60  # generous: a loaded machine is slow, not wrong
        while not await reg.workers() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [w.id for w in await reg.workers()] == ["env-t"]
        assert await reg.pick_worker("calc") == "http://x"
        while not (await reg.pools()).get("sandbox:idle") and time.monotonic() < deadline + 10:
            time.sleep(0.1)  # pre-warmed sandboxes are reported for the gateway's /metrics
        assert (await reg.pools())["sandbox:idle"] >= 1
        with pytest.raises(ValueError):  # UnknownEnv: no worker ever hosted it
            await reg.pick_worker("chess")
    assert await reg.workers() == []


async def test_an_env_no_worker_ever_hosted_is_rejected_and_a_dead_workers_is_lost(redis, keys):
    from env_workers.client import EnvWorkerLost

    reg = Registry(redis, keys)
    envs = RemoteEnvs(reg.pick_worker)
    with pytest.raises(EnvWorkerLost, match="no env worker registered yet"):  # none yet: they may be starting
        await envs.open("no-such-env", {"seed": 1}, None)
    await redis.hset(keys.workers, "env-dead", WorkerInfo(id="env-dead", url="http://127.0.0.1:1",
                                                          envs=["calc"]).model_dump_json())
    with pytest.raises(EnvWorkerLost):  # registered, not heartbeating: restarting, come back later
        await envs.open("calc", {"seed": 1}, None)
    with pytest.raises(EnvRejected):  # nobody ever offered it: bad input, never retried
        await envs.open("no-such-env", {"seed": 1}, None)
    await redis.set(keys.worker_alive("env-dead"), "1")
    with pytest.raises(EnvWorkerLost):  # alive in Redis, but nothing listens there
        await envs.open("calc", {"seed": 1}, None)
    await envs.aclose()
