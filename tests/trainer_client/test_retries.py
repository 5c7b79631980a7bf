"""The client rides out a restarting gateway or Redis, and never repeats what is unsafe to repeat."""

from __future__ import annotations

import json

import httpx
import pytest

from trainer_client import AsyncRolloutClient, RolloutClient
from trainer_client._errors import APIError, TransportError

CREATED = {"id": "b1", "num_trajectories": 1, "created": True}


def flaky(answers: list, seen: list):
    """A transport answering from `answers` in turn: a status code, or an exception to raise."""
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        if a == 503:
            return httpx.Response(503, headers={"Retry-After": "0"},
                                  json={"error": {"code": "redis_unavailable", "message": "away", "details": None}})
        return httpx.Response(a, json=CREATED)
    return handle


def test_submit_retries_503_and_refused_connections_with_one_idempotency_key():
    seen: list[httpx.Request] = []
    answers = [httpx.ConnectError("refused"), 503, httpx.ReadError("reset"), 202]
    with RolloutClient("http://gw", transport=httpx.MockTransport(flaky(answers, seen)), retries=5) as c:
        c.delay = lambda *a, **k: (None if (w := RolloutClient.delay(c, *a, **k)) is None else 0.0)
        assert c.submit([{"seed": 1}], env="calc").id == "b1"
    keys = {json.loads(r.content)["idempotency_key"] for r in seen}
    assert len(seen) == 4 and len(keys) == 1 and keys.pop().startswith("auto-")


def test_a_non_idempotent_post_is_not_repeated_after_it_may_have_arrived():
    seen: list[httpx.Request] = []
    with RolloutClient("http://gw", transport=httpx.MockTransport(flaky([503], seen))) as c:
        with pytest.raises(APIError) as e:
            c.update_weights(path="/ckpt")
    assert e.value.status == 503 and len(seen) == 1
    seen.clear()
    with RolloutClient("http://gw", transport=httpx.MockTransport(flaky([httpx.ReadError("reset")], seen))) as c:
        with pytest.raises(TransportError):
            c.update_weights(path="/ckpt")
    assert len(seen) == 1


def test_retries_are_bounded():
    seen: list[httpx.Request] = []
    with RolloutClient("http://gw", transport=httpx.MockTransport(flaky([503] * 10, seen)), retries=2) as c:
        c.delay = lambda *a, **k: (None if (w := RolloutClient.delay(c, *a, **k)) is None else 0.0)
        with pytest.raises(APIError) as e:
            c.status("b1")
    assert e.value.code == "redis_unavailable" and len(seen) == 3


async def test_the_async_client_retries_the_same_way():
    seen: list[httpx.Request] = []
    answers = [httpx.ConnectError("refused"), 503, 202]
    async with AsyncRolloutClient("http://gw", transport=httpx.MockTransport(flaky(answers, seen))) as c:
        c.delay = lambda *a, **k: (None if (w := AsyncRolloutClient.delay(c, *a, **k)) is None else 0.0)
        assert (await c.submit([{"seed": 1}], env="calc", idempotency_key="mine")).id == "b1"
    assert [json.loads(r.content)["idempotency_key"] for r in seen] == ["mine"] * 3
