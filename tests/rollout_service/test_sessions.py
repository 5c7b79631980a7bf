"""The OpenAI-compatible session proxy, driven by the real `openai` client."""

from __future__ import annotations

import itertools

import httpx
import openai
import pytest
import redis as syncredis

from rollout_service.engines.sim import SimEngine
from rollout_service.engines.sim_server import create_app as sim_app
from tests.conftest import REDIS_URL, LiveServer
from wire import EngineInfo


class Recording(SimEngine):
    def __init__(self, replies):
        it = itertools.cycle(replies)
        super().__init__("sim", policy=lambda prompt, rng: next(it))
        self.prompts: list[list[int]] = []

    async def generate(self, req):
        self.prompts.append(list(req.prompt_ids))
        return await super().generate(req)


@pytest.fixture
def engine(keys):
    eng = Recording(["Hello! I can help.", "calc: 6 * 7", "answer: 42"])
    with LiveServer(sim_app(eng)) as srv:
        syncredis.Redis.from_url(REDIS_URL).hset(keys.engines, "sim", EngineInfo(id="sim", url=srv.url)
                                                 .model_dump_json())
        yield eng


def session(gateway) -> tuple[str, openai.OpenAI]:
    created = httpx.post(f"{gateway.url}/v1/sessions", json={"metadata": {"agent": "test"}}).json()
    return created["id"], openai.OpenAI(base_url=gateway.url + created["base_url_path"], api_key="unused",
                                        max_retries=0)


def test_openai_client_turns_become_an_exact_trajectory(gateway, engine):
    sid, client = session(gateway)
    history = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}]
    r1 = client.chat.completions.create(model="sim", messages=history, temperature=0.7, max_tokens=64)
    assert r1.choices[0].message.content == "Hello! I can help." and r1.usage.completion_tokens > 0
    history += [{"role": "assistant", "content": r1.choices[0].message.content},
                {"role": "user", "content": "What is 6 times 7?"}]
    r2 = client.chat.completions.create(model="sim", messages=history)
    assert r2.choices[0].message.content == "calc: 6 * 7"
    # the agent rewrites history (drops the greeting): a new training sample starts
    rewritten = [history[0], {"role": "user", "content": "What is 6 times 7? Answer directly."}]
    client.chat.completions.create(model="sim", messages=rewritten)

    traj = httpx.get(f"{gateway.url}/v1/sessions/{sid}").json()
    turns = traj["turns"]
    assert [t["segment"] for t in turns] == [0, 0, 1]
    # per segment, the concatenation is exactly what the engine saw, sampled ids included
    for k, t in enumerate(turns):
        context = [i for u in turns[:k] if u["segment"] == t["segment"] for i in u["prompt_ids"] + u["output_ids"]]
        assert engine.prompts[k] == context + t["prompt_ids"]
    assert traj["task"] == {"agent": "test"} and traj["state"] == "running"
    done = httpx.post(f"{gateway.url}/v1/sessions/{sid}/finish", json={"reward": 1.0}).json()
    assert done["state"] == "completed" and done["reward"] == 1.0
    with pytest.raises(openai.ConflictError):
        client.chat.completions.create(model="sim", messages=history)


def test_unsupported_fields_are_422_naming_them(gateway, engine):
    _, client = session(gateway)
    msgs = [{"role": "user", "content": "hi"}]
    cases = [({"logit_bias": {"1": 5}}, "logit_bias"), ({"frequency_penalty": 0.5}, "frequency_penalty"),
             ({"response_format": {"type": "json_object"}}, "response_format"),
             ({"tool_choice": "required", "tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice"),
             ({"audio": {"voice": "x", "format": "wav"}}, "audio")]
    for extra, field in cases:
        with pytest.raises(openai.UnprocessableEntityError) as e:
            client.chat.completions.create(model="sim", messages=msgs, extra_body=extra)
        message = e.value.body["message"]
        assert field in message and "not supported" in message, message
    with pytest.raises(openai.UnprocessableEntityError) as e:
        client.chat.completions.create(model="sim", messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:,"}}]}])
    assert "'image_url' is not supported" in e.value.body["message"]
    # what breaks the documented types is refused, never coerced (`true` is not 1, "3" not 3)
    for wrong in ({"n": True}, {"max_tokens": "3"}, {"logprobs": 1}, {"seed": 2.5}):
        with pytest.raises(openai.UnprocessableEntityError) as e:
            client.chat.completions.create(model="sim", messages=msgs, extra_body=wrong)
        assert next(iter(wrong)) in e.value.body["message"], e.value.body
    # a union's mismatched branch is not what the message names: `[]` for `str | list` said
    # "body.input.str: Input should be a valid string"; the list branch's own complaint now
    with pytest.raises(openai.UnprocessableEntityError) as e:
        client.responses.create(model="sim", input=[])
    assert e.value.body["message"] == "request failed validation: body.input: Value should have at least 1 item " \
        "after validation, not 0", e.value.body
    # neutral values and fields that change nothing sampled pass
    ok = client.chat.completions.create(model="sim", messages=msgs, frequency_penalty=0, store=True, user="u",
                                        metadata={"k": "v"}, parallel_tool_calls=True)
    assert ok.choices[0].message.content == "Hello! I can help."
    # 3.0 is an integer to JSON Schema
    assert client.chat.completions.create(model="sim", messages=msgs, extra_body={"max_tokens": 3.0}).choices
    missing = openai.OpenAI(base_url=f"{gateway.url}/v1/sessions/s-nope", api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        missing.chat.completions.create(model="sim", messages=msgs)


def test_text_parts_null_content_and_tool_messages_are_accepted(gateway, engine):
    sid, client = session(gateway)
    r = client.chat.completions.create(model="sim", messages=[
        {"role": "developer", "content": [{"type": "text", "text": "Be terse."}, {"type": "text", "text": "Really."}]},
        {"role": "user", "content": "add 2 and 3"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "5"}])
    assert r.choices[0].message.content == "Hello! I can help."
    prompt = engine.tok.decode(engine.prompts[0])
    # no tools offered: earlier calls are still rendered, in the fallback (hermes) format
    assert "system\nBe terse.\nReally." in prompt and '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}' \
        in prompt and "<|im_start|>tool\n5<|im_end|>" in prompt
    traj = httpx.get(f"{gateway.url}/v1/sessions/{sid}").json()
    assert traj["messages"][2]["tool_calls"][0]["id"] == "call_1" and traj["messages"][3]["tool_call_id"] == "call_1"


def test_no_engine_is_503(gateway):
    _, client = session(gateway)
    with pytest.raises(openai.InternalServerError) as e:
        client.chat.completions.create(model="sim", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 503


def test_a_call_the_engine_refuses_is_a_422_and_the_engine_stays_up(gateway, keys):
    """The engine's refusal (here: the conversation fills its context) is the caller's to fix: a 422
    `engine_rejected` with the engine's reason, not a 503 `engine_unavailable`, and the engine serves
    the next call. An empty stop string is refused before any engine sees it."""
    with LiveServer(sim_app(Recording(["ok"]), max_model_len=120)) as srv:
        syncredis.Redis.from_url(REDIS_URL).hset(keys.engines, "sim", EngineInfo(id="sim", url=srv.url)
                                                 .model_dump_json())
        _, client = session(gateway)
        with pytest.raises(openai.UnprocessableEntityError) as e:
            client.chat.completions.create(model="sim", messages=[{"role": "user", "content": "x" * 200}])
        assert e.value.body["code"] == "engine_rejected" and "max_model_len" in e.value.body["message"]
        with pytest.raises(openai.UnprocessableEntityError):
            client.chat.completions.create(model="sim", messages=[{"role": "user", "content": "hi"}], stop=[""])
        r = client.chat.completions.create(model="sim", messages=[{"role": "user", "content": "hi"}], max_tokens=8)
        assert r.choices[0].message.content
