"""Third-party names over the env worker's real HTTP: 4xx for names that give no env, `env`
failures (never a 500) for an env's own exceptions, and routing by family."""

from __future__ import annotations

import httpx
import pytest
import reasoning_gym

from env_workers import adapters
from env_workers.client import EnvRejected, EnvUnavailable, RemoteEnvs
from env_workers.server import create_app
from scheduler.registry import Registry
from tests.conftest import LiveServer
from wire import WorkerInfo

GUESS = "gymnasium:tests.env_workers.adapters.textgames:textgames/GuessWord-v0"


@pytest.fixture(scope="module")
def env_server():
    with LiveServer(create_app(max_sessions=8)) as srv:
        yield srv


def _err(r: httpx.Response) -> tuple[int, str, str]:
    e = r.json()["error"]
    return r.status_code, e["code"], e["message"]


def test_a_reasoning_gym_episode_over_http(env_server):
    entry = reasoning_gym.create_dataset("leg_counting", seed=4, size=1)[0]
    with httpx.Client(base_url=env_server.url, timeout=60) as c:
        opened = c.post("/v1/sessions", json={"env": "reasoning_gym:leg_counting", "task": {"seed": 4}}).json()
        assert opened["observation"][1]["content"] == entry["question"]
        r = c.post(f"/v1/sessions/{opened['session_id']}/step",
                   json={"action": f"<answer>{entry['answer']}</answer>"}).json()
        assert r["terminated"] and r["reward"] == 1.0


def test_names_that_give_no_env_are_4xx_naming_the_problem(env_server, monkeypatch):
    with httpx.Client(base_url=env_server.url, timeout=60) as c:
        def open_(env, task=None):
            return c.post("/v1/sessions", json={"env": env, "task": task or {"seed": 1}})

        status, code, msg = _err(open_("reasoning_gym:no_such_generator"))
        assert (status, code) == (404, "not_found") and "no_such_generator" in msg
        status, code, msg = _err(open_("no_family:x"))
        assert (status, code) == (404, "not_found") and "family" in msg
        status, code, msg = _err(open_("gymnasium:CartPole-v1"))
        assert (status, code) == (422, "env_unadaptable") and "observation space" in msg
        monkeypatch.setitem(adapters.FAMILIES, "absent", adapters.Family("gymnasium", "no_such_package_here",
                                                                         "no-such-package", "a family not installed"))
        status, code, msg = _err(open_("absent:thing"))
        assert (status, code) == (422, "env_package_missing") and "no-such-package" in msg
        status, code, msg = _err(open_("reasoning_gym:leg_counting", {"seed": 1, "config": {"bogus": 1}}))
        assert (status, code) == (422, "env_error") and "bogus" in msg
        assert open_("not a name!").status_code == 422  # the wire's name pattern


def test_an_envs_own_exception_is_an_env_failure_with_its_message(env_server):
    with httpx.Client(base_url=env_server.url, timeout=60) as c:
        sid = c.post("/v1/sessions", json={"env": GUESS, "task": {"seed": 0}}).json()["session_id"]
        status, code, msg = _err(c.post(f"/v1/sessions/{sid}/step", json={"action": "crash"}))
    assert (status, code) == (502, "env_crashed") and "RuntimeError: the guessing machine broke" in msg


async def test_the_client_maps_them_onto_failure_kinds(env_server):
    async def pick(env):
        return env_server.url

    envs = RemoteEnvs(pick)
    h, _ = await envs.open(GUESS, {"seed": 0}, None)
    with pytest.raises(EnvUnavailable, match="guessing machine broke"):  # kind `env`, with its message
        await envs.step(h, "crash")
    with pytest.raises(EnvRejected, match="no_such_generator"):  # bad input, never retried
        await envs.open("reasoning_gym:no_such_generator", {"seed": 1}, None)
    await envs.aclose()


def test_envs_lists_installed_families_with_versions(env_server):
    body = httpx.get(f"{env_server.url}/v1/envs").json()
    fams = {f["name"]: f for f in body["families"]}
    assert {"reasoning_gym:*", "gymnasium:*", "verifiers:*"} <= set(fams)
    assert fams["reasoning_gym:*"]["version"] == "0.1.25" and fams["reasoning_gym:*"]["description"]


async def test_a_worker_announcing_a_family_gets_its_names(redis, keys):
    reg = Registry(redis, keys)
    await reg.announce_worker(WorkerInfo(id="env-f", url="http://f", envs=["math", "reasoning_gym:*"]), {}, 10)
    assert await reg.pick_worker("reasoning_gym:leg_counting") == "http://f"
    assert await reg.pick_worker("math") == "http://f"
    with pytest.raises(ValueError):
        await reg.pick_worker("gymnasium:textgames/Corridor-v0")
    await reg.withdraw_worker("env-f")
