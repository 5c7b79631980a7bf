"""The session proxy's OpenAI features, driven by the real `openai` client against the
simulated engine in its scripted mode: stop strings, logprobs, sampling parameters, tool
calls (two parsers, and a parse failure), streaming and `n`."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
import redis as syncredis

from rollout_service.engines.sim import SimEngine, scripted
from rollout_service.engines.sim_server import create_app as sim_app
from rollout_service.tokens import ByteTokenizer
from tests.conftest import REDIS_URL, LiveServer
from tests.rollout_service.test_sessions import session
from wire import EngineInfo

TOK = ByteTokenizer()
ADD = {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
CALL = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
FINAL = "The sum is 5."


class Scripted(SimEngine):
    """The simulated engine answering a script, keeping every request it got."""

    def __init__(self, replies):
        super().__init__("sim", policy=scripted(replies))
        self.requests = []

    def sample(self, req):  # what generate and stream both sample from
        self.requests.append(req)
        return super().sample(req)


def serve(keys, replies, tool_parser="hermes"):
    eng = Scripted(replies)
    srv = LiveServer(sim_app(eng)).__enter__()
    syncredis.Redis.from_url(REDIS_URL).hset(keys.engines, "sim", EngineInfo(
        id="sim", url=srv.url, tool_parser=tool_parser).model_dump_json())
    return eng, srv


@pytest.fixture
def engine(keys):
    eng, srv = serve(keys, [CALL, FINAL])
    yield eng
    srv.__exit__()


def trajectory(gateway, sid) -> dict:
    return httpx.get(f"{gateway.url}/v1/sessions/{sid}", params={"samples": "true"}).json()


def test_stop_string_ends_the_text_where_the_engine_stopped(gateway, keys):
    eng, srv = serve(keys, ["Hello world, how are you?", "Fine."])
    try:
        sid, client = session(gateway)
        msgs = [{"role": "user", "content": "hi"}]
        r = client.chat.completions.create(model="sim", messages=msgs, stop=[" how", ","])
        assert r.choices[0].message.content == "Hello world" and r.choices[0].finish_reason == "stop"
        turn = trajectory(gateway, sid)["turns"][0]
        # the ids sampled up to and including the stop string's last token; no eos was sampled
        assert turn["output_ids"] == TOK.encode("Hello world,") and eng.requests[0].sampling.stop == [" how", ","]
        # the agent sends the text back: the next prompt appends to the sampled ids, closing them with eos
        r2 = client.chat.completions.create(model="sim", messages=[
            *msgs, {"role": "assistant", "content": "Hello world"}, {"role": "user", "content": "and?"}])
        assert r2.choices[0].message.content == "Fine."
        turns = trajectory(gateway, sid)["turns"]
        assert [t["segment"] for t in turns] == [0, 0]
        assert eng.requests[1].prompt_ids == turns[0]["prompt_ids"] + turns[0]["output_ids"] + turns[1]["prompt_ids"]
        assert turns[1]["prompt_ids"][0] == TOK.eos_id
        # the simulated engine's own completions honour stop too, as vLLM's do
        body = httpx.post(f"{srv.url}/v1/completions", json={"prompt": TOK.render(
            [], add_generation_prompt=True), "max_tokens": 64, "stop": [", "], "return_token_ids": True}).json()
        choice = body["choices"][0]
        assert choice["text"] == "Hello world" and choice["token_ids"] == TOK.encode("Hello world, ")
    finally:
        srv.__exit__()


def test_logprobs_and_top_logprobs_are_the_engines(gateway, engine):
    sid, client = session(gateway)
    msgs = [{"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model="sim", messages=msgs, logprobs=True, top_logprobs=3)
    turn = trajectory(gateway, sid)["turns"][0]
    content = r.choices[0].logprobs.content
    assert len(content) == len(turn["output_ids"]) - 1  # the closing eos is not part of the text
    assert [c.logprob for c in content] == turn["output_logprobs"][:-1]
    assert "".join(c.token for c in content) == CALL
    for c, i in zip(content, turn["output_ids"]):
        assert len(c.top_logprobs) == 3 and c.top_logprobs[0].token == TOK.decode([i]) and bytes(c.bytes) == bytes([i])
        assert c.top_logprobs[0].logprob == c.logprob
    plain = client.chat.completions.create(model="sim", messages=msgs)
    assert plain.choices[0].logprobs is None
    # top_logprobs is used only with logprobs (OpenAI's rule)
    assert client.chat.completions.create(model="sim", messages=msgs, top_logprobs=2).choices[0].logprobs is None


def test_sampling_parameters_reach_the_engine(gateway, engine):
    sid, client = session(gateway)
    msgs = [{"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model="sim", messages=msgs, max_completion_tokens=5, seed=11,
                                       temperature=0.3, top_p=0.9)
    s = engine.requests[0].sampling
    assert (s.max_tokens, s.seed, s.temperature, s.top_p) == (5, 11, 0.3, 0.9)
    assert r.choices[0].finish_reason == "length" and r.choices[0].message.content == CALL[:5]
    assert trajectory(gateway, sid)["turns"][0]["output_ids"] == TOK.encode(CALL[:5])
    # the same seed samples the same logprobs in another session
    sid2, client2 = session(gateway)
    client2.chat.completions.create(model="sim", messages=msgs, max_completion_tokens=5, seed=11, temperature=0.3,
                                    top_p=0.9)
    assert trajectory(gateway, sid2)["turns"][0]["output_logprobs"] == \
        trajectory(gateway, sid)["turns"][0]["output_logprobs"]


def tool_episode(client, **kw):
    """Two calls: the model calls `add`, the agent answers the call, the model concludes."""
    msgs = [{"role": "system", "content": "You add."}, {"role": "user", "content": "What is 2 + 3?"}]
    r1 = client.chat.completions.create(model="sim", messages=msgs, tools=[ADD], seed=3, **kw)
    return msgs, r1


def test_tool_calls_parsed_and_sampled_ids_kept(gateway, engine):
    sid, client = session(gateway)
    msgs, r1 = tool_episode(client)
    c = r1.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content == "Let me add."
    (call,) = c.message.tool_calls
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 3}
    msgs += [c.message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": "5"}]
    r2 = client.chat.completions.create(model="sim", messages=msgs, tools=[ADD])
    assert r2.choices[0].message.content == FINAL and r2.choices[0].finish_reason == "stop"
    httpx.post(f"{gateway.url}/v1/sessions/{sid}/finish", json={"reward": 1.0})

    traj = trajectory(gateway, sid)
    t0, t1 = traj["turns"]
    assert t0["output_ids"] == [*TOK.encode(CALL), TOK.eos_id]  # as sampled: never re-tokenized from the JSON
    assert t1["output_ids"] == [*TOK.encode(FINAL), TOK.eos_id]
    assert [t["segment"] for t in traj["turns"]] == [0, 0] and t0["tool_failure"] is None
    # the template had no tool support: the tools went into the system message in the fallback format
    first_prompt = TOK.decode(t0["prompt_ids"])
    assert "You add.\n\n# Tools" in first_prompt and '"name": "add"' in first_prompt and "<tool_call>" in first_prompt
    assert TOK.decode(t1["prompt_ids"]).endswith("<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n")
    assert traj["messages"][2]["tool_calls"][0]["id"] == call.id and traj["messages"][3]["tool_call_id"] == call.id
    (sample,) = traj["training_samples"]
    assert sample["loss_mask"] == [0] * len(t0["prompt_ids"]) + [1] * len(t0["output_ids"]) + \
        [0] * len(t1["prompt_ids"]) + [1] * len(t1["output_ids"])
    assert traj["reward"] == 1.0 and traj["state"] == "completed"


@pytest.mark.parametrize("reply, why", [
    ('<tool_call>{"name": "add", "arguments": {"a": 2,</tool_call>', "not JSON"),
    ('<tool_call>{"name": "sub", "arguments": {}}</tool_call>', "unknown tool 'sub'"),
    ('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}', "closed"),
])
def test_unparsable_tool_call_is_a_plain_message_and_a_tool_failure(gateway, keys, reply, why):
    eng, srv = serve(keys, [reply])
    try:
        sid, client = session(gateway)
        r = client.chat.completions.create(model="sim", messages=[{"role": "user", "content": "add"}], tools=[ADD])
        c = r.choices[0]
        assert c.finish_reason == "stop" and c.message.content == reply and c.message.tool_calls is None
        (turn,) = trajectory(gateway, sid)["turns"]
        assert turn["tool_failure"].startswith("unparsable tool call (hermes)") and why in turn["tool_failure"]
        assert turn["output_ids"] == [*TOK.encode(reply), TOK.eos_id]
    finally:
        srv.__exit__()


def test_parser_comes_from_the_engines_registration(gateway, keys):
    reply = 'Adding. [TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}]'
    eng, srv = serve(keys, [reply], tool_parser="mistral")
    try:
        sid, client = session(gateway)
        r = client.chat.completions.create(model="sim", messages=[{"role": "user", "content": "1+2"}], tools=[ADD])
        (call,) = r.choices[0].message.tool_calls
        assert r.choices[0].message.content == "Adding." and json.loads(call.function.arguments) == {"a": 1, "b": 2}
        assert "[TOOL_CALLS]" in TOK.decode(eng.requests[0].prompt_ids)  # mistral's fallback instructions
        # tool_choice "none": no tools rendered, nothing parsed
        r = client.chat.completions.create(model="sim", messages=[{"role": "user", "content": "x"}], tools=[ADD],
                                           tool_choice="none")
        assert r.choices[0].message.tool_calls is None and r.choices[0].message.content == reply
        assert "[TOOL_CALLS]" not in TOK.decode(eng.requests[1].prompt_ids)
    finally:
        srv.__exit__()


def test_stream_gives_openai_chunks_and_the_same_trajectory(gateway, engine):
    plain_sid, plain = session(gateway)
    msgs, r1 = tool_episode(plain)
    sid, client = session(gateway)
    stream = client.chat.completions.create(model="sim", messages=msgs, tools=[ADD], seed=3, stream=True,
                                            stream_options={"include_usage": True}, logprobs=True)
    chunks = list(stream)
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == "Let me add."
    assert sum(1 for d in deltas if d.content) > 1  # token by token, not one piece
    (call,) = [tc for d in deltas for tc in d.tool_calls or []]
    assert call.id == r1.choices[0].message.tool_calls[0].id.replace(plain_sid[2:], sid[2:])
    assert json.loads(call.function.arguments) == {"a": 2, "b": 3}
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == ["tool_calls"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(TOK.encode(CALL)) + 1
    lps = [e.logprob for ch in chunks if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    streamed, unstreamed = trajectory(gateway, sid)["turns"], trajectory(gateway, plain_sid)["turns"]
    assert lps == streamed[0]["output_logprobs"][:-1]
    for a, b in zip(streamed, unstreamed, strict=True):
        assert (a["prompt_ids"], a["output_ids"], a["output_logprobs"]) == \
            (b["prompt_ids"], b["output_ids"], b["output_logprobs"])
    # the openai client's own accumulator rebuilds the message
    with client.chat.completions.stream(model="sim", messages=[{"role": "user", "content": "x"}], tools=[ADD]) as s:
        final = s.get_final_completion()
    assert final.choices[0].message.tool_calls[0].function.name == "add"


def test_n_choices_are_samples_sharing_the_prompt(gateway, engine):
    sid, client = session(gateway)
    msgs, r = tool_episode(client, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2] and all(c.finish_reason == "tool_calls" for c in r.choices)
    assert r.usage.completion_tokens == 3 * (len(TOK.encode(CALL)) + 1)
    traj = trajectory(gateway, sid)
    samples = traj["training_samples"]
    assert len(samples) == 3 and len(traj["turns"]) == 3
    prompt = engine.requests[0].prompt_ids
    assert all(r.prompt_ids == prompt for r in engine.requests) and len({r.sampling.seed for r in engine.requests}) == 3
    for s in samples:
        assert s["token_ids"] == [*prompt, *TOK.encode(CALL), TOK.eos_id]
        assert s["loss_mask"] == [0] * len(prompt) + [1] * (len(TOK.encode(CALL)) + 1)
    assert len({tuple(s["logprobs"]) for s in samples}) == 3  # distinct samples
    # the agent goes on from choice 0: the session's own sample grows by appending
    c = r.choices[0]
    msgs += [c.message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": c.message.tool_calls[0].id, "content": "5"}]
    client.chat.completions.create(model="sim", messages=msgs, tools=[ADD])
    traj = trajectory(gateway, sid)
    assert [t["segment"] for t in traj["turns"]] == [1, 2, 0, 0]
    assert traj["training_samples"][0]["token_ids"][:len(prompt)] == prompt


def test_responses_api_text_and_function_calls(gateway, engine):
    sid, client = session(gateway)
    tool = {"type": "function", "name": "add", "description": "Add two integers.",
            "parameters": ADD["function"]["parameters"], "strict": True}
    items = [{"role": "user", "content": "What is 2 + 3?"}]
    r1 = client.responses.create(model="sim", instructions="You add.", input=items, tools=[tool], store=False)
    assert r1.status == "completed" and [o.type for o in r1.output] == ["message", "function_call"]
    assert r1.output[0].content[0].text == "Let me add."
    call = r1.output[1]
    assert call.name == "add" and json.loads(call.arguments) == {"a": 2, "b": 3}
    items += [o.model_dump(exclude_none=True) for o in r1.output]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "5"})
    r2 = client.responses.create(model="sim", instructions="You add.", input=items, tools=[tool], store=False)
    assert r2.output_text == FINAL and r2.usage.output_tokens == len(TOK.encode(FINAL)) + 1

    traj = trajectory(gateway, sid)
    t0, t1 = traj["turns"]
    assert [t["segment"] for t in traj["turns"]] == [0, 0]  # the second call appended to the first
    assert t0["output_ids"] == [*TOK.encode(CALL), TOK.eos_id] and t1["output_ids"] == [*TOK.encode(FINAL), TOK.eos_id]
    assert traj["messages"][2]["tool_calls"][0]["id"] == call.call_id == traj["messages"][3]["tool_call_id"]
    # what it cannot honour is named
    for extra, field in [({"previous_response_id": "resp_1"}, "previous_response_id"),
                         ({"input": [{"type": "reasoning", "summary": []}]}, "'reasoning'"),
                         ({"tools": [{"type": "web_search"}]}, "'web_search'")]:
        with pytest.raises(openai.UnprocessableEntityError) as e:
            client.responses.create(**{"model": "sim", "input": "hi", **extra})
        assert field in e.value.body["message"] and "not supported" in e.value.body["message"]
    cut = client.responses.create(model="sim", input="hi", max_output_tokens=4)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
