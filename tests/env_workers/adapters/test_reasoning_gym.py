"""reasoning-gym through `reasoning_gym:NAME`: every generator reachable, its own scorer."""

from __future__ import annotations

import re

import pytest
import reasoning_gym
from reasoning_gym.factory import DATASETS

from env_workers import registry
from env_workers.adapters import reasoning_gym as rg
from env_workers.checker import check_env
from env_workers.env import EnvError

PLAIN = sorted(n for n in DATASETS if n != "composite")  # composite needs a config naming its parts
SAMPLE = PLAIN[::5]


def test_the_sample_is_big_enough():
    assert len(SAMPLE) >= 20


@pytest.mark.parametrize("name", SAMPLE)
def test_check_env_on_a_sample_of_generators(name):
    check_env(f"reasoning_gym:{name}")


@pytest.mark.parametrize("name", SAMPLE[:5])
def test_check_env_on_the_retry_variant(name):
    check_env(f"reasoning_gym_retry:{name}")


def test_every_generator_is_reachable_and_scored_by_its_own_scorer():
    solved = []
    for name in PLAIN:
        env = registry.make(f"reasoning_gym:{name}")
        obs, _ = env.reset({"seed": 7})
        entry = reasoning_gym.create_dataset(name, seed=7, size=1)[0]
        assert obs[-1].content == entry["question"], name
        r = env.step(f"thinking... <answer>{entry['answer']}</answer>")
        assert r.terminated and 0.0 <= r.reward <= 1.0, name
        if r.reward == 1.0:
            solved.append(name)
    # a few generators accept many answers and store none (graph_color, rubiks_cube, ...)
    assert len(solved) >= len(PLAIN) - 10, sorted(set(PLAIN) - set(solved))
    assert len(rg.names()) == len(DATASETS) >= 100


def test_a_wrong_or_missing_answer_scores_zero():
    env = registry.make("reasoning_gym:leg_counting")
    env.reset({"seed": 1})
    assert env.step("<answer>-1</answer>").reward == 0.0
    env.reset({"seed": 1})
    r = env.step("292")  # no answer tags: nothing to score
    assert r.reward == 0.0 and r.info["answer"] is None


def test_config_reaches_the_generator_and_composite_is_reachable():
    env = registry.make("reasoning_gym:leg_counting")
    obs, _ = env.reset({"seed": 3, "config": {"min_animals": 1, "max_animals": 1}})
    assert re.search(r"if you have \d+ \w+\?", obs[-1].content)  # one kind of animal: no list
    env = registry.make("reasoning_gym:composite")
    obs, _ = env.reset({"seed": 3, "config": {"datasets": [{"name": "leg_counting", "weight": 1.0, "config": {}}]}})
    assert "legs" in obs[-1].content
    with pytest.raises(EnvError, match="refused the task"):
        env.reset({"seed": 3, "config": {"no_such_field": 1}})
    with pytest.raises(EnvError):
        env.reset({"seed": "three"})


def test_retry_variant_gives_feedback_then_scores_the_last_answer():
    env = registry.make("reasoning_gym_retry:leg_counting")
    env.reset({"seed": 1, "attempts": 3})
    entry = reasoning_gym.create_dataset("leg_counting", seed=1, size=1)[0]
    wrong = env.step("<answer>0</answer>")
    assert not wrong.terminated and wrong.reward == 0.0 and "not correct" in wrong.observation[0].content
    untagged = env.step("I forgot the tags")
    assert not untagged.terminated and "<answer>" in untagged.observation[0].content
    right = env.step(f"<answer>{entry['answer']}</answer>")
    assert right.terminated and right.reward == 1.0
    env.reset({"seed": 1, "attempts": 2})
    env.step("<answer>0</answer>")
    last = env.step("<answer>1</answer>")
    assert last.terminated and last.reward == 0.0
    with pytest.raises(EnvError):
        env.step("<answer>1</answer>")


def test_worked_examples_come_first_from_seeds_no_task_uses():
    env = registry.make("reasoning_gym:basic_arithmetic")
    obs, info = env.reset({"seed": 5, "examples": 2})
    entry = reasoning_gym.create_dataset("basic_arithmetic", seed=5, size=1)[0]
    shots = reasoning_gym.create_dataset("basic_arithmetic", seed=5 + rg.EXAMPLE_SEED, size=2)
    assert [m.role for m in obs] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert [obs[1].content, obs[3].content] == [shots[0]["question"], shots[1]["question"]]
    assert obs[2].content == f"<answer>{shots[0]['answer']}</answer>" and info["examples"] == 2
    assert obs[-1].content == entry["question"]  # the task's own item, as without examples
    assert env.step(f"<answer>{entry['answer']}</answer>").reward == 1.0
    for bad in (-1, 9, True, "2"):
        with pytest.raises(EnvError, match="examples"):
            env.reset({"seed": 5, "examples": bad})


def test_single_turn_refuses_attempts():
    with pytest.raises(EnvError, match="attempts"):
        registry.make("reasoning_gym:leg_counting").reset({"seed": 1, "attempts": 3})


def test_an_unknown_generator_names_the_problem():
    with pytest.raises(registry.UnknownEnv, match="leg_counting"):
        registry.spec("reasoning_gym:leg_countin")
    with pytest.raises(registry.UnknownEnv, match="family"):
        registry.spec("no_such_family:x")
