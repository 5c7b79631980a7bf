import pytest

from env_workers import registry
from env_workers.client import LocalEnvs
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




async def test_local_envs_call_an_inline_env_on_the_loop_and_any_other_in_a_thread(probe_envs):
    """An env whose calls are microseconds of computation (`EnvSpec.inline`) is called on the
    event loop: a thread handoff per call cost more than the call (and the GIL with it). Any
    other env, one that may block on a sandbox, runs in a thread so the loop keeps heartbeating."""
    envs = LocalEnvs()
    for name in probe_envs:
        h, _ = await envs.open(name, {"question": "1+1?", "answer": 2}, 0)
        got = await envs.step(h, "answer: 2")
        await envs.close(h)
        assert got.reward == 1.0
    assert probe_envs == {"probe-inline": [True, True], "probe-threaded": [False, False]}


def test_an_inline_env_may_not_acquire_resources():
    """Its calls run on the event loop; a sandbox's would block it (the one rule, in the spec)."""
    from env_workers.registry import EnvSpec

    with pytest.raises(ValueError, match="inline"):
        EnvSpec("x", lambda: None, "", resources=(object(),), inline=True)
