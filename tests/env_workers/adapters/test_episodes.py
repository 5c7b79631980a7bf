"""Third-party envs in the real multi-turn loop: a scripted engine, our env worker over HTTP,
exact tokens, the env's reward, and an env's own exception as a failure of kind `env`."""

from __future__ import annotations

import itertools

import pytest
import reasoning_gym

from env_workers.client import RemoteEnvs
from env_workers.server import create_app
from rollout_service.engines.fleet import Fleet
from rollout_service.engines.sim import SimEngine
from rollout_service.rollout import run_episode
from rollout_service.tokens import ByteTokenizer
from scheduler.store import Work
from tests.conftest import LiveServer
from wire import FailureKind, RolloutRequest, TrajectoryState

TOK = ByteTokenizer()


def scripted(*replies: str):
    it = itertools.cycle(replies)
    return lambda prompt, rng: next(it)


@pytest.fixture(scope="module")
def env_url():
    with LiveServer(create_app()) as srv:
        yield srv.url


def work(env: str, task: dict, **kw) -> Work:
    return Work("b-0-0", "b", 0, 0, task, RolloutRequest(tasks=[task], env=env, **kw))


async def _episode(env_url, name, task, *replies, **kw):
    async def pick(env):
        return env_url

    envs = RemoteEnvs(pick)
    try:
        eng = SimEngine(policy=scripted(*replies))
        return await run_episode(work(name, task, **kw), Fleet({eng.id: (eng, "byte")}), envs)
    finally:
        await envs.aclose()


async def test_reasoning_gym_retry_episode_exact_tokens_and_reward(env_url):
    entry = reasoning_gym.create_dataset("leg_counting", seed=5, size=1)[0]
    right = f"<answer>{entry['answer']}</answer>"
    traj = await _episode(env_url, "reasoning_gym_retry:leg_counting", {"seed": 5}, "<answer>0</answer>", right)
    assert traj.state is TrajectoryState.completed and traj.reward == 1.0 and len(traj.turns) == 2
    assert traj.turns[1].output_ids == [*TOK.encode(right), TOK.eos_id]
    assert "not correct" in TOK.decode(traj.turns[1].prompt_ids)  # the feedback entered as prompt, mask 0


async def test_verifiers_multi_turn_episode(env_url):
    traj = await _episode(env_url, "verifiers:tests.env_workers.adapters.vf_guess", {"index": 1}, "3", "7")
    assert traj.state is TrajectoryState.completed and traj.reward == pytest.approx(1.0 + 0.5 / 2)
    assert "higher" in TOK.decode(traj.turns[1].prompt_ids)


async def test_an_envs_own_exception_fails_the_trajectory_with_kind_env(env_url):
    traj = await _episode(env_url, "gymnasium:tests.env_workers.adapters.textgames:textgames/GuessWord-v0",
                          {"seed": 0}, "crash")
    assert traj.state is TrajectoryState.failed and traj.failure.kind is FailureKind.env
    assert "the guessing machine broke" in traj.failure.message


async def test_an_unknown_name_is_rejected_not_retried(env_url):
    traj = await _episode(env_url, "reasoning_gym:no_such_generator", {"seed": 1}, "x")
    assert traj.state is TrajectoryState.failed and traj.failure.kind is FailureKind.rejected
    assert "no_such_generator" in traj.failure.message
