"""`openenv:URL` against OpenEnv's own server (`openenv-core`'s `create_fastapi_app`) hosting a
small multi-step environment written on its `Environment` base class: the episode holds one
WebSocket session, so state carries across steps (its HTTP /step would start afresh)."""

from __future__ import annotations

import random

import httpx
import pytest
from openenv.core.env_server import Action, Environment, Observation, State, create_fastapi_app

from env_workers import adapters, registry
from env_workers.checker import check_env
from env_workers.env import EnvError, EnvUnavailable
from tests.conftest import LiveServer


class GuessAction(Action):
    guess: str


class GuessObservation(Observation):
    feedback: str


class GuessEnv(Environment):
    """Guess a number in 1..20: 'higher' / 'lower' until right, at most five guesses."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state, self.secret = State(step_count=0), 0

    def reset(self, seed=None, episode_id=None, **kw) -> GuessObservation:
        self.secret = random.Random(seed).randint(1, 20)
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(feedback="I picked a number from 1 to 20. Guess it.", reward=None, done=False)

    def step(self, action: GuessAction, timeout_s=None, **kw) -> GuessObservation:
        self._state.step_count += 1
        try:
            n = int(action.guess.strip())
        except ValueError:
            raise ValueError(f"not a number: {action.guess!r}") from None
        if n == self.secret:
            return GuessObservation(feedback="right", reward=1.0, done=True)
        done = self._state.step_count >= 5
        return GuessObservation(feedback="higher" if n < self.secret else "lower", reward=0.0, done=done)

    @property
    def state(self) -> State:
        return self._state


class TwoFields(Action):
    x: int
    y: int


@pytest.fixture(scope="module")
def server():
    with LiveServer(create_fastapi_app(GuessEnv, GuessAction, GuessObservation, max_concurrent_envs=8)) as srv:
        yield srv


def solve(env, seed: int) -> tuple[int, float]:
    """Binary search through the env's feedback: only works if state lives across steps."""
    obs, _ = env.reset({"reset": {}, "instructions": "Answer with a number."}, seed=seed)
    assert [(m.role, m.content) for m in obs] == [("system", "Answer with a number."),
                                                   ("user", "I picked a number from 1 to 20. Guess it.")]
    lo, hi, steps = 1, 20, 0
    while True:
        guess = (lo + hi) // 2
        r = env.step(str(guess))
        steps += 1
        if r.terminated:
            return steps, r.reward
        (msg,) = r.observation
        lo, hi = (guess + 1, hi) if msg.content == "higher" else (lo, guess - 1)


def test_a_multi_step_episode_keeps_its_session(server):
    env = registry.make(f"openenv:{server.url}")
    for seed in range(4):
        steps, reward = solve(env, seed=seed)
        assert reward == 1.0  # the search narrowed on the same secret: one environment all episode
        assert steps > 1 or random.Random(seed).randint(1, 20) == 10  # 10 is the first guess
    env.close()


def test_check_env(server):
    check_env(f"openenv:{server.url}", actions=("7", "12", "1"))


def test_env_errors_are_env_failures_with_its_message(server):
    env = registry.make(f"openenv:{server.url}")
    env.reset({}, seed=1)
    with pytest.raises(EnvError, match="not a number: 'eleven'"):
        env.step("eleven")
    env.close()
    with pytest.raises(EnvError, match="after the episode ended"):
        env.step("3")


def test_a_server_gone_mid_episode_is_unavailable():
    with LiveServer(create_fastapi_app(GuessEnv, GuessAction, GuessObservation)) as srv:
        env = registry.make(f"openenv:{srv.url}")
        env.reset({}, seed=2)
    with pytest.raises(EnvUnavailable):
        env.step("4")


def test_names_that_give_no_env_are_refused():
    with pytest.raises(registry.UnknownEnv, match="no OpenEnv server answers"):
        adapters.resolve("openenv:http://127.0.0.1:9")
    with pytest.raises(registry.UnknownEnv, match="http"):
        adapters.resolve("openenv:ftp://x")
    with LiveServer(create_fastapi_app(GuessEnv, TwoFields, GuessObservation)) as srv:
        with pytest.raises(registry.EnvUnadaptable, match=r"\['x', 'y'\]"):
            adapters.resolve(f"openenv:{srv.url}")


def test_over_the_env_workers_http_api_a_bad_name_is_a_4xx(server):
    from env_workers.server import create_app

    with LiveServer(create_app(max_sessions=8)) as worker, httpx.Client(base_url=worker.url, timeout=60) as c:
        r = c.post("/v1/sessions", json={"env": "openenv:http://127.0.0.1:9", "task": {}})
        assert r.status_code == 404 and "no OpenEnv server answers" in r.json()["error"]["message"]
        ok = c.post("/v1/sessions", json={"env": f"openenv:{server.url}", "task": {}, "seed": 3})
        assert ok.status_code in (200, 201), ok.text
