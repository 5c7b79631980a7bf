"""Gymnasium text envs through `gymnasium:ID`, with test envs registered as a package would."""

from __future__ import annotations

import pytest

from env_workers import registry
from env_workers.checker import check_env

MOD = "tests.env_workers.adapters.textgames"
GUESS = f"gymnasium:{MOD}:textgames/GuessWord-v0"
CORRIDOR = f"gymnasium:{MOD}:textgames/Corridor-v0"


@pytest.mark.parametrize("name", [GUESS, CORRIDOR])
def test_check_env(name):
    check_env(name)


def test_text_spaces_play_an_episode():
    env = registry.make(GUESS)
    obs, info = env.reset({"seed": 0})
    assert obs[0].content.startswith("Guess the hidden") and "one of:" in obs[1].content and info == {"guesses": 0}
    words = obs[1].content.split(": ")[1].split(", ")
    for w in words:
        r = env.step(f"  {w}\n")
        if r.terminated:
            break
    assert r.terminated and r.reward == 1.0 and r.info["guesses"] <= len(words)


def test_an_action_outside_the_space_is_text_back_not_a_crash():
    env = registry.make(GUESS)
    env.reset({"seed": 0})
    r = env.step("two words")
    assert not r.terminated and r.info == {"invalid_action": True} and "Invalid action" in r.observation[0].content


def test_discrete_spaces_read_the_last_integer():
    env = registry.make(CORRIDOR)
    obs, _ = env.reset({"seed": 0})
    assert obs[1].content == "0" and "from 0 to 1" in obs[0].content
    assert env.step("I go right: 1").observation[0].content == "1"
    assert "Invalid action" in env.step("7").observation[0].content
    env.step("1")
    r = env.step("1")
    assert r.terminated and r.reward == 1.0


def test_names_that_give_no_env_say_why():
    with pytest.raises(registry.EnvUnadaptable, match="Box"):
        registry.spec(f"gymnasium:{MOD}:textgames/Pendulumish-v0")
    with pytest.raises(registry.EnvUnadaptable, match="observation space"):
        registry.spec("gymnasium:CartPole-v1")
    with pytest.raises(registry.UnknownEnv, match="No-Such"):
        registry.spec("gymnasium:No-Such-v0")
    with pytest.raises(registry.EnvPackageMissing, match="not_installed_pkg"):
        registry.spec("gymnasium:not_installed_pkg:Thing-v0")
