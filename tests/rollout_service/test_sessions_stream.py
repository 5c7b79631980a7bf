"""Streaming through the session proxy, with the real `openai` client: content goes out while
the engine samples (the engine's own stream, through the vLLM adapter and the simulated
engine's vLLM-shaped SSE), stop strings and tool calls hold back what could be taken back,
and the trajectory is the one a plain call records."""

from __future__ import annotations

import asyncio
import threading

import httpx
import openai
import pytest
import redis as syncredis

from rollout_service.engines.base import TokenDelta
from rollout_service.engines.sim_server import create_app as sim_app
from tests.conftest import REDIS_URL, LiveServer
from tests.rollout_service.test_sessions import session
from tests.rollout_service.test_sessions_openai import (  # noqa: F401 (engine: a fixture)
    ADD,
    CALL,
    TOK,
    Scripted,
    engine,
    serve,
    trajectory,
)
from wire import EngineInfo

MSGS = [{"role": "user", "content": "hi"}]


class Gated(Scripted):
    """Streams `held` tokens, then waits for the test to open the gate before sampling on."""

    def __init__(self, replies, held: int):
        super().__init__(replies)
        self.held, self.gate, self.waiting = held, threading.Event(), threading.Event()

    async def stream(self, req):
        n = 0
        async for ev in super().stream(req):
            if isinstance(ev, TokenDelta) and n == self.held:
                self.waiting.set()
                if not await asyncio.to_thread(self.gate.wait, 60):
                    raise RuntimeError("the test never opened the gate")
            n += isinstance(ev, TokenDelta)
            yield ev


class Failing(Scripted):
    """Streams `good` tokens, then fails as an engine that died mid-request."""

    def __init__(self, replies, good: int):
        super().__init__(replies)
        self.good = good

    async def stream(self, req):
        n = 0
        async for ev in super().stream(req):
            if n == self.good:
                raise RuntimeError("engine died")
            n += 1
            yield ev


def register(keys, eng):
    srv = LiveServer(sim_app(eng)).__enter__()
    syncredis.Redis.from_url(REDIS_URL).hset(keys.engines, "sim", EngineInfo(id="sim", url=srv.url).model_dump_json())
    return srv


def contents(chunks, k=0) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == k)


def test_content_arrives_while_the_engine_is_still_sampling(gateway, keys):
    eng = Gated(["Hello world, how are you?"], held=8)
    srv = register(keys, eng)
    try:
        sid, client = session(gateway)
        stream = client.chat.completions.create(model="sim", messages=MSGS, stream=True)
        got = ""
        for chunk in stream:  # the engine is stopped after 8 tokens: these came before the reply was sampled
            got += chunk.choices[0].delta.content or ""
            if len(got) >= 8:
                break
        assert eng.waiting.is_set() and not eng.gate.is_set()
        assert got == "Hello wo"
        assert trajectory(gateway, sid)["turns"] == []  # nothing recorded before the reply is whole
        eng.gate.set()
        rest = list(stream)
        assert got + contents(rest) == "Hello world, how are you?"
        assert [c.choices[0].finish_reason for c in rest if c.choices][-1] == "stop"
        (turn,) = trajectory(gateway, sid)["turns"]
        assert turn["output_ids"] == [*TOK.encode("Hello world, how are you?"), TOK.eos_id]
    finally:
        eng.gate.set()
        srv.__exit__()


def test_stop_string_text_is_never_sent(gateway, keys):
    eng, srv = serve(keys, ["Hello world, how are you?"])
    try:
        sid, client = session(gateway)
        chunks = list(client.chat.completions.create(model="sim", messages=MSGS, stop=[" world,"], seed=1, stream=True))
        pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
        assert "".join(pieces) == "Hello" and len(pieces) == 5  # " w", " wo", ... held, then dropped
        plain_sid, plain = session(gateway)
        r = plain.chat.completions.create(model="sim", messages=MSGS, stop=[" world,"], seed=1)
        assert r.choices[0].message.content == "Hello"
        a, b = trajectory(gateway, sid)["turns"][0], trajectory(gateway, plain_sid)["turns"][0]
        assert a["output_ids"] == b["output_ids"] == TOK.encode("Hello world,")
        assert a["output_logprobs"] == b["output_logprobs"]
    finally:
        srv.__exit__()


def test_multibyte_characters_go_out_whole(gateway, keys):
    eng, srv = serve(keys, ["Grüße, 東京"])  # the byte tokenizer: one token per UTF-8 byte
    try:
        _, client = session(gateway)
        chunks = list(client.chat.completions.create(model="sim", messages=MSGS, stream=True))
        pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
        assert "".join(pieces) == "Grüße, 東京" and "\ufffd" not in "".join(pieces)
        assert "ü" in pieces and "東" in pieces  # each sent once its last byte was sampled
    finally:
        srv.__exit__()


def test_whitespace_before_a_call_is_held_and_content_matches_the_plain_answer(gateway, keys):
    eng, srv = serve(keys, ["Adding now.  \n\n<tool_call>\n" + CALL.split("<tool_call>\n")[1]])
    try:
        _, client = session(gateway)
        chunks = list(client.chat.completions.create(model="sim", messages=MSGS, tools=[ADD], stream=True))
        assert contents(chunks) == "Adding now."
        (call,) = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
        assert call.function.name == "add"
        _, plain = session(gateway)
        msg = plain.chat.completions.create(model="sim", messages=MSGS, tools=[ADD]).choices[0].message
        assert msg.content == "Adding now." and msg.tool_calls[0].function.arguments == call.function.arguments
    finally:
        srv.__exit__()


def test_n_choices_stream_side_by_side(gateway, engine):
    sid, client = session(gateway)
    chunks = list(client.chat.completions.create(model="sim", messages=MSGS, n=2, seed=5, stream=True, logprobs=True,
                                                 stream_options={"include_usage": True}))
    assert {c.choices[0].index for c in chunks if c.choices} == {0, 1}
    assert [contents(chunks, k) for k in (0, 1)] == [CALL, CALL]
    finishes = {c.choices[0].index: c.choices[0].finish_reason
                for c in chunks if c.choices and c.choices[0].finish_reason}
    assert finishes == {0: "stop", 1: "stop"}  # no tools offered: the call is text
    turns = trajectory(gateway, sid)["turns"]
    assert len(turns) == 2 and chunks[-1].usage.completion_tokens == 2 * (len(TOK.encode(CALL)) + 1)
    for k in (0, 1):
        lps = [e.logprob for c in chunks if c.choices and c.choices[0].index == k and c.choices[0].logprobs
               for e in c.choices[0].logprobs.content]
        turn = [t for t in turns if t["segment"] == (0 if k == 0 else 1)][0]
        assert lps == turn["output_logprobs"][:-1]


def test_engine_failing_mid_stream_is_an_error_event_and_records_nothing(gateway, keys):
    eng = Failing(["Hello world, how are you?"], good=6)
    srv = register(keys, eng)
    try:
        sid, client = session(gateway)
        got = ""
        with pytest.raises(openai.APIError, match="engine"):
            for chunk in client.chat.completions.create(model="sim", messages=MSGS, stream=True):
                got += chunk.choices[0].delta.content or "" if chunk.choices else ""
        assert got == "Hello "  # what came before the failure
        assert trajectory(gateway, sid)["turns"] == []
        # the session is not stuck: its lock was released
        eng.good = 10_000
        assert client.chat.completions.create(model="sim", messages=MSGS).choices[0].message.content \
            == "Hello world, how are you?"
    finally:
        srv.__exit__()


def test_engine_down_before_the_first_token_is_a_503(gateway, keys):
    syncredis.Redis.from_url(REDIS_URL).hset(keys.engines, "sim", EngineInfo(
        id="sim", url="http://127.0.0.1:9").model_dump_json())  # nothing listens on port 9
    sid, _ = session(gateway)
    r = httpx.post(f"{gateway.url}/v1/sessions/{sid}/chat/completions",
                   json={"model": "sim", "messages": MSGS, "stream": True}, timeout=60)
    assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable"
