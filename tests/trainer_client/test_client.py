"""The trainer SDK, sync and async, against a live gateway and worker."""

from __future__ import annotations

import pytest

from trainer_client import APIError, AsyncRolloutClient, NotFoundError, RolloutClient, TransportError
from tests.conftest import RunningWorker, free_port

TASKS = [{"question": "What is 6 times 7?", "answer": 42}, {"seed": 4}]


def test_submit_and_iter_results(gateway, settings):
    with RolloutClient(gateway.url) as c, RunningWorker(settings):
        batch = c.submit(TASKS, env="calc", group_size=4, sampling={"temperature": 1.0, "max_tokens": 64})
        got = list(c.iter_results(batch.id))
        assert len(got) == 8 and len({t.id for t in got}) == 8
        for t in got:
            assert len(t.token_ids) == len(t.logprobs) == len(t.loss_mask) > 0
            assert t.reward is not None and t.failure is None
            assert sum(t.loss_mask) == sum(len(x.output_ids) for x in t.turns)
        st = c.wait(batch.id, timeout=10)
        assert st.state.value == "completed" and st.done == 8
        assert [t.id for t in c.trajectories(batch.id, page_size=3)] == [f"{batch.id}-{g}-{s}" for g in range(2)
                                                                          for s in range(4)]


async def test_tasks_may_be_any_iterable_of_dicts(gateway):
    """A generator or a tuple of tasks (a `datasets.Dataset` iterates its rows as dicts) was a
    pydantic "Input should be a valid list"; a single dict is still refused, not read as its keys."""
    rows = ({"seed": i} for i in range(3))
    with RolloutClient(gateway.url) as c:
        bid = c.submit(rows, env="math").id
        assert c.request(bid).tasks == [{"seed": 0}, {"seed": 1}, {"seed": 2}]
        with pytest.raises(ValueError, match="valid list"):
            c.submit({"seed": 1}, env="math")
    async with AsyncRolloutClient(gateway.url) as c:
        bid = (await c.submit(tuple(TASKS), env="calc")).id
        assert (await c.request(bid)).tasks == TASKS


def test_errors_are_typed(gateway):
    with RolloutClient(gateway.url) as c:
        with pytest.raises(NotFoundError):
            c.status("missing")
        with pytest.raises(APIError) as e:
            c._req("POST", "/v1/batches", json={"tasks": [{}], "env": "bad env!"})
        assert e.value.status == 422 and e.value.code == "invalid_request"
    with RolloutClient(f"http://127.0.0.1:{free_port()}") as c, pytest.raises(TransportError):
        c.status("x")


async def test_async_client(gateway, settings):
    async with AsyncRolloutClient(gateway.url) as c:
        with RunningWorker(settings):
            batch = await c.submit(TASKS, env="math", group_size=2, idempotency_key="a1")
            again = await c.submit(TASKS, env="math", group_size=2, idempotency_key="a1")
            assert again.id == batch.id and not again.created
            got = [t async for t in c.iter_results(batch.id)]
        assert len(got) == 4 and all(t.state.value == "completed" for t in got)
        assert (await c.cancel(batch.id)).state.value == "completed"  # finished batches stay finished


def test_the_async_client_has_every_method_of_the_sync_one():
    import inspect

    def public(cls):
        return {n for n, _ in inspect.getmembers(cls) if not n.startswith("_")} - {"close", "aclose"}

    assert public(RolloutClient) == public(AsyncRolloutClient)


async def test_admin_methods_sync_and_async(gateway):
    """What `rollout engines/workers/keys/status` use: public methods, the same in both clients."""
    with RolloutClient(gateway.url) as c:
        c.register_engine("e-admin", "http://127.0.0.1:9", model="m")
        assert c.set_engine_role("e-admin", "prefill")["role"] == "prefill"
        assert c.workers() == [] and c.batches() == []
        assert "rollout_queue_depth" in c.metrics()
        assert c.states().usable == ["completed", "truncated"]
        key = c.create_api_key("team-a")
        assert key.tenant == "team-a" and not key.admin and key.key
    async with AsyncRolloutClient(gateway.url) as a:
        assert (await a.set_engine_role("e-admin", "decode"))["role"] == "decode"
        assert [e["id"] for e in await a.engines()] == ["e-admin"]
        assert await a.workers() == [] and await a.batches() == []
        assert "rollout_queue_depth" in await a.metrics()
        assert (await a.create_api_key("team-b", admin=True)).admin
        await a.deregister_engine("e-admin")
        assert await a.engines() == []
