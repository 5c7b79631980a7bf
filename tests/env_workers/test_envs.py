import pytest

from env_workers import registry
from env_workers.checker import check_env
from env_workers.envs.calc import evaluate
from env_workers.envs.problems import parse_answer, word_problem


@pytest.fixture
def fake_judge(monkeypatch):
    """`judge` asks the engine fleet by default; the checker gets a deterministic judge."""
    from env_workers.envs import judge

    monkeypatch.setattr(judge, "_default_judge", lambda messages: "score: 5")


@pytest.mark.parametrize("name", registry.names())
def test_every_registered_env_conforms(name, fake_judge):
    check_env(name)


def test_math_rewards_exact_answer_only():
    env = registry.make("math")
    env.reset({"question": "6*7?", "answer": 42})
    assert env.step("so... answer: 42").reward == 1.0
    env.reset({"question": "6*7?", "answer": 42})
    assert env.step("answer: 41").reward == 0.0


def test_calc_tool_then_answer():
    env = registry.make("calc")
    env.reset({"seed": 5})
    expected = word_problem(5)
    r = env.step(f"calc: {expected['expression']}")
    assert not r.terminated and r.observation[0].content == f"result: {expected['answer']}"
    r = env.step(f"answer: {expected['answer']}")
    assert r.terminated and r.reward == 1.0


def test_calc_tool_error_is_text_not_a_crash():
    env = registry.make("calc")
    env.reset({"seed": 1})
    r = env.step("calc: __import__('os')")
    assert r.observation[0].content.startswith("error:") and not r.terminated


def test_evaluate_is_integer_arithmetic_only():
    assert evaluate("(3 + 4) * 5 - 10 // 3") == 32
    with pytest.raises(ValueError):
        evaluate("2 ** 100000")


def test_parse_answer():
    assert parse_answer("blah answer: 1,234") == 1234
    assert parse_answer("I think 7 then 9") == 9
    assert parse_answer("nothing") is None
