"""`judge`: the score is parsed from the judge's text; a broken judge is an error, never 0."""

from __future__ import annotations

import json

import httpx
import pytest

from env_workers.env import EnvUnavailable
from env_workers.envs import judge as judge_mod
from env_workers.envs.judge import JudgeEnv, JudgeUnavailable, OpenAIJudge, parse_score
from tests.conftest import LiveServer, free_port


def fake_judge(messages) -> str:
    """Deterministic: 2 points per distinct word of the response, at most 10."""
    response = messages[-1].content.split("RESPONSE:\n", 1)[1].split("\n\nGrade it now")[0]
    return f"Reasoning...\nscore: {min(10, 2 * len(set(response.split())))}"


def test_reward_is_the_judges_score_over_ten():
    env = JudgeEnv(judge=fake_judge)
    obs, _ = env.reset({"seed": 1})
    assert "judge" in obs[0].content
    r = env.step("two words")
    assert r.terminated and r.reward == 0.4 and "score: 4" in r.info["judge"]


def test_the_judge_sees_request_rubric_and_reference():
    seen = []
    env = JudgeEnv(judge=lambda m: seen.append(m) or "score: 10")
    env.reset({"prompt": "Name a prime.", "rubric": "Any prime.", "reference": "7"})
    env.step("11")
    text = seen[0][-1].content
    assert all(s in text for s in ("Name a prime.", "Any prime.", "7", "RESPONSE:\n11"))


@pytest.mark.parametrize("text,score", [("score: 7", 0.7), ("Score = **9**", 0.9), ("I'd say 6/10.", 0.6),
                                        ("score: 2 ... on reflection, score: 8", 0.8), ("score: 7.5", 0.75)])
def test_parse_score(text, score):
    assert parse_score(text) == score


@pytest.mark.parametrize("text", ["great answer!", "score: 11", ""])
def test_unparseable_or_out_of_range_is_an_error(text):
    with pytest.raises(JudgeUnavailable):
        parse_score(text)


def test_a_failing_judge_raises_and_the_step_can_be_retried():
    calls = []

    def flaky(m):
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("judge down")
        return "score: 5"

    env = JudgeEnv(judge=flaky)
    env.reset({"seed": 0})
    with pytest.raises(EnvUnavailable, match="judge down"):
        env.step("answer")
    assert env.step("answer").reward == 0.5


def test_no_judge_configured_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(judge_mod, "_default_judge", None)
    env = JudgeEnv()
    env.reset({"seed": 0})
    with pytest.raises(JudgeUnavailable, match="no judge configured"):
        env.step("x")


def test_openai_judge_with_nothing_listening():
    judge = OpenAIJudge(f"http://127.0.0.1:{free_port()}/v1", timeout_s=5)
    with pytest.raises(JudgeUnavailable, match="no judge reachable"):
        judge(judge_mod.judge_messages({"prompt": "p", "rubric": "r"}, "x"))


def test_openai_judge_refuses_an_answer_that_is_not_a_chat_completion():
    transport = httpx.MockTransport(lambda req: httpx.Response(200, json={"choices": []}))
    with pytest.raises(JudgeUnavailable, match="not a chat completion"):
        OpenAIJudge("http://judge/v1", transport=transport)(judge_mod.judge_messages({"prompt": "p", "rubric": "r"},
                                                                                     "x"))


def test_openai_judge_sends_the_chat_greedily():
    seen = []

    def answer(req: httpx.Request) -> httpx.Response:
        seen.append((str(req.url), json.loads(req.content)))
        return httpx.Response(200, json={"choices": [{"message": {"role": "assistant", "content": "ok. score: 7"}}]})

    judge = OpenAIJudge("http://judge/v1/", model="j", max_tokens=9, transport=httpx.MockTransport(answer))
    env = JudgeEnv(judge=judge)
    env.reset({"prompt": "What is 2+2?"})
    assert env.step("4").reward == 0.7
    url, body = seen[0]
    assert url == "http://judge/v1/chat/completions" and body["model"] == "j" and body["temperature"] == 0.0
    assert body["max_tokens"] == 9 and body["messages"][0]["role"] == "system"


def test_openai_judge_asks_the_simulated_engine_over_http():
    """The real path, over HTTP, against the simulated engine's chat completions. Its toy
    policy is no grader: no score, a clear error."""
    from rollout_service.engines.sim import SimEngine
    from rollout_service.engines.sim_server import create_app

    with LiveServer(create_app(SimEngine("judge-0", seed=1))) as srv:
        judge = OpenAIJudge(f"{srv.url}/v1", model="sim", max_tokens=32)
        text = judge(judge_mod.judge_messages({"prompt": "What is 2+2?", "rubric": "r"}, "4"))
        assert isinstance(text, str) and text
        env = JudgeEnv(judge=judge)
        env.reset({"prompt": "What is 2+2?"})
        try:
            r = env.step("4")
            assert 0.0 <= r.reward <= 1.0
        except JudgeUnavailable as e:
            assert "no score" in str(e)
