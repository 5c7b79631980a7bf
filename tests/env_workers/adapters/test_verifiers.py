"""verifiers environments through `verifiers:MODULE`: its loader, its env_response, its rubric."""

from __future__ import annotations

import httpx
import pytest

from env_workers import registry
from env_workers.checker import check_env
from env_workers.env import EnvError
from env_workers.server import create_app
from tests.conftest import LiveServer

GUESS = "verifiers:tests.env_workers.adapters.vf_guess"
SINGLE = "verifiers:tests.env_workers.adapters.vf_single"


@pytest.mark.parametrize("name", [GUESS, SINGLE])
def test_check_env(name):
    check_env(name)


def test_single_turn_rubric_reward_per_function():
    env = registry.make(SINGLE)
    obs, info = env.reset({"index": 1})
    assert obs[-1].content == "What is 10 + 32? Reply with the number only." and info == {"example_id": 1}
    r = env.step("42")
    assert r.terminated and r.reward == pytest.approx(1.2)  # 1.0 * exact + 0.2 * short
    assert r.info["metrics"]["exact"] == 1.0 and r.info["metrics"]["short"] == 1.0
    env.reset({"index": 1})
    r = env.step("the answer is 41")
    assert r.reward == 0.0 and r.info["metrics"] == {"exact": 0.0, "short": 0.0, "num_turns": 1.0}


def test_multi_turn_runs_its_env_response_and_stop_condition():
    env = registry.make(GUESS)
    obs, _ = env.reset({"index": 1})  # the answer is 7
    assert [m.role for m in obs] == ["system", "user"]
    assert env.step("3").observation[0].content == "higher"
    assert env.step("9").observation[0].content == "lower"
    r = env.step("7")
    assert r.terminated and r.info["stop"] == "solved"
    assert r.info["metrics"]["correct"] == 1.0 and r.info["metrics"]["few_turns"] == pytest.approx(1 / 3)
    assert r.reward == pytest.approx(1.0 + 0.5 / 3)
    with pytest.raises(EnvError):
        env.step("7")
    env.close()


def test_an_episode_cut_short_by_our_turn_limit_closes_cleanly():
    env = registry.make(GUESS)
    env.reset({"seed": 0})
    env.step("1")
    env.close()  # verifiers' loop is waiting for a reply: it ends
    assert env._thread is None
    obs, _ = env.reset({"seed": 2})  # and the env is usable again
    assert obs[-1].content.startswith("Guess my number")


def test_its_exception_is_an_env_failure_and_bad_tasks_are_rejected():
    env = registry.make(GUESS)
    env.reset({"index": 0})
    with pytest.raises(RuntimeError, match="hint machine exploded"):
        env.step("explode")
    with pytest.raises(EnvError, match="outside"):
        env.reset({"index": 99})
    with pytest.raises(registry.EnvPackageMissing, match="not installed"):
        registry.spec("verifiers:no_such_verifiers_env")


def test_over_http_the_crash_is_502_env_crashed():
    with LiveServer(create_app()) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        opened = c.post("/v1/sessions", json={"env": GUESS, "task": {"index": 0}}).json()
        r = c.post(f"/v1/sessions/{opened['session_id']}/step", json={"action": "explode"})
        assert r.status_code == 502 and r.json()["error"]["code"] == "env_crashed"
        assert "hint machine exploded" in r.json()["error"]["message"]
        missing = c.post("/v1/sessions", json={"env": "verifiers:no_such_verifiers_env", "task": {"index": 0}})
        assert missing.status_code == 422 and missing.json()["error"]["code"] == "env_package_missing"
