"""`nemo_gym:URL` against a minimal resources server (tests/env_workers/adapters/nemo_server.py)."""

from __future__ import annotations

import pytest

from env_workers import registry
from env_workers.checker import check_env
from env_workers.env import EnvError, EnvUnavailable
from tests.conftest import LiveServer
from tests.env_workers.adapters import nemo_server

ROW = {"responses_create_params": {"input": [{"role": "developer", "content": "Answer with a number."},
                                             {"role": "user", "content": "What is 6 times 7?"}]},
       "expected_answer": "42"}


@pytest.fixture(scope="module")
def server():
    with LiveServer(nemo_server.create_app()) as srv:
        yield srv


def test_check_env(server):
    name = f"nemo_gym:{server.url}"
    registry.spec(name).example_tasks.append(ROW)
    check_env(name)


def test_the_server_verifies_the_answer(server):
    env = registry.make(f"nemo_gym:{server.url}")
    obs, _ = env.reset(ROW)
    assert [(m.role, m.content) for m in obs] == [("system", "Answer with a number."), ("user", "What is 6 times 7?")]
    r = env.step("42")
    assert r.terminated and r.reward == 1.0 and r.info == {"verify": {"exact_match": True}}
    env.reset(ROW)
    assert env.step("41").reward == 0.0
    with pytest.raises(EnvError):
        env.step("42")


def test_failures_keep_their_kinds(server):
    env = registry.make(f"nemo_gym:{server.url}")
    with pytest.raises(EnvError, match="refused /seed_session"):  # the server's 4xx: a bad row
        env.reset({"responses_create_params": {"input": "hi"}})
    with pytest.raises(EnvError, match="NeMo Gym row"):
        env.reset({"question": "no params"})
    env.reset(ROW)
    with pytest.raises(RuntimeError, match="500"):  # its own bug: the env's failure
        env.step("boom")
    gone = registry.make("nemo_gym:http://127.0.0.1:1")
    with pytest.raises(EnvUnavailable, match="unreachable"):
        gone.reset(ROW)
    with pytest.raises(registry.UnknownEnv, match="URL"):
        registry.spec("nemo_gym:ftp-server")
