"""The session proxy streaming from a real vLLM CPU server (SmolLM2), through the real `openai`
client: the streamed text is vLLM's own (stop string included), the recorded ids and logprobs
are the ones vLLM sampled, and a stream records what a plain call records."""

from __future__ import annotations

import httpx
import pytest
import redis as syncredis

from tests.conftest import REDIS_URL
from tests.rollout_service.test_sessions import session
from wire import EngineInfo

pytestmark = pytest.mark.integration

MSGS = [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Describe the sea in two sentences."}]


def turns(gateway, sid) -> list[dict]:
    return httpx.get(f"{gateway.url}/v1/sessions/{sid}").json()["turns"]


@pytest.mark.timeout(900)  # the session's first vLLM start counts too: minutes on a busy CPU
def test_streamed_reply_is_what_vllm_sampled(vllm_server, gateway, keys):
    syncredis.Redis.from_url(REDIS_URL).hset(keys.engines, "vllm-0", EngineInfo(
        id="vllm-0", url=vllm_server.url, model=vllm_server.name, tokenizer=str(vllm_server.model_dir)).model_dump_json())
    greedy = {"model": vllm_server.name, "messages": MSGS, "temperature": 0.0, "max_tokens": 40}
    _, client = session(gateway)
    whole = client.chat.completions.create(**greedy).choices[0].message.content
    assert len(whole) > 20
    stop = whole[12:15]  # a stop string the greedy reply is sure to reach, most likely ending mid-token

    sid, client = session(gateway)
    chunks = list(client.chat.completions.create(**greedy, stop=[stop], stream=True, logprobs=True,
                                                 stream_options={"include_usage": True}))
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    (turn,) = turns(gateway, sid)
    # vLLM's own answer to the same prompt ids, its own stop-string handling
    own = httpx.post(f"{vllm_server.url}/v1/completions", timeout=120, json={
        "model": vllm_server.name, "prompt": turn["prompt_ids"], "temperature": 0.0, "max_tokens": 40,
        "stop": [stop], "return_token_ids": True, "logprobs": 1, "skip_special_tokens": False}).json()["choices"][0]
    assert len(pieces) > 1 and "".join(pieces) == own["text"] == whole[: whole.find(stop)]
    assert turn["output_ids"] == own["token_ids"]
    lps = [e.logprob for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert lps == turn["output_logprobs"]  # no eos was sampled: every token's logprob went out
    assert lps == pytest.approx(own["logprobs"]["token_logprobs"], abs=1e-4)
    assert chunks[-1].usage.completion_tokens == len(turn["output_ids"])

    plain_sid, plain = session(gateway)
    assert plain.chat.completions.create(**greedy, stop=[stop]).choices[0].message.content == "".join(pieces)
    assert turns(gateway, plain_sid)[0]["output_ids"] == turn["output_ids"]
