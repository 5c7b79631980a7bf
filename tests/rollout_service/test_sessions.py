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


def test_unsupported_features_are_clear_4xx(gateway, engine):
    _, client = session(gateway)
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.UnprocessableEntityError):
        client.chat.completions.create(model="sim", messages=msgs, stream=True)
    with pytest.raises(openai.UnprocessableEntityError):
        client.chat.completions.create(model="sim", messages=msgs, tools=[{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "properties": {}}}}])
    missing = openai.OpenAI(base_url=f"{gateway.url}/v1/sessions/s-nope", api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        missing.chat.completions.create(model="sim", messages=msgs)


def test_no_engine_is_503(gateway):
    _, client = session(gateway)
    with pytest.raises(openai.InternalServerError) as e:
        client.chat.completions.create(model="sim", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 503
