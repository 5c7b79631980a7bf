"""The SDK reads trajectories in the compact form (sync and async), into numpy and torch, from a
gateway whose results live in Redis or on disk; JSON when asked, or when that is all there is."""

from __future__ import annotations

import dataclasses

import httpx
import numpy as np
import pytest

from rollout_service.app import create_app
from tests.conftest import LiveServer, RunningWorker
from trainer_client import AsyncRolloutClient, RolloutClient
from trainer_client.grpo import advantages, pack
from trainer_client.tensors import as_numpy, as_torch
from wire.packed import MEDIA_TYPE

TASKS = [{"question": "What is 6 times 7?", "answer": 42}, {"seed": 4}]


class Recording(httpx.HTTPTransport):
    """The real transport, noting each request's Accept and each answer's content type."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[str, str]] = []

    def handle_request(self, request):
        r = super().handle_request(request)
        self.seen.append((request.headers.get("accept", ""), r.headers.get("content-type", "")))
        return r


@pytest.fixture(params=["redis", "file"])
def store_settings(request, settings, tmp_path):
    if request.param == "redis":
        return settings
    return dataclasses.replace(settings, result_store=f"file://{tmp_path}/results")


def test_sync_client_reads_compact_into_tensors(store_settings):
    with LiveServer(create_app(store_settings)) as gw, RunningWorker(store_settings):
        transport = Recording()
        with RolloutClient(gw.url, transport=transport) as c, RolloutClient(gw.url, compact=False) as j:
            bid = c.submit(TASKS, env="calc", group_size=3, sampling={"max_tokens": 48}).id
            got = list(c.iter_packed_results(bid))
            assert len(got) == 6
            assert transport.seen[-1][1] == MEDIA_TYPE and MEDIA_TYPE in transport.seen[-1][0]
            packed = {p.id: p for p in c.packed_trajectories(bid, page_size=4)}
            as_json = {t.id: t for t in j.trajectories(bid)}
            assert set(packed) == set(as_json) == {p.id for p in got}
            for tid, t in as_json.items():
                ids, mask, lps = as_numpy(packed[tid].samples()[0])
                assert ids.tolist() == t.token_ids and mask.tolist() == t.loss_mask
                assert np.array_equal(lps, np.float32(t.logprobs)) and len(ids) > 0
                assert c.trajectory(tid).token_ids == t.token_ids  # the Trajectory model, fetched compact
            order = sorted(as_json)
            advs = advantages([packed[t] for t in order])
            a, b = pack([packed[t] for t in order], advs, pad_id=0), pack([as_json[t] for t in order], advs, pad_id=0)
            assert a.input_ids.equal(b.input_ids) and a.loss_mask.equal(b.loss_mask)
            assert a.old_logprobs.equal(b.old_logprobs.float())


async def test_async_client_reads_compact(settings):
    with LiveServer(create_app(settings)) as gw, RunningWorker(settings):
        async with AsyncRolloutClient(gw.url) as c, AsyncRolloutClient(gw.url, compact=False) as j:
            bid = (await c.submit(TASKS, env="math", group_size=2)).id
            got = [p async for p in c.iter_packed_results(bid)]
            assert len(got) == 4
            packed = [p async for p in c.packed_trajectories(bid)]
            plain = [t async for t in j.trajectories(bid)]
            assert [p.id for p in packed] == [t.id for t in plain]
            for p, t in zip(packed, plain):
                ids, mask, lps = as_torch(p.samples()[0])
                assert ids.tolist() == t.token_ids and mask.tolist() == t.loss_mask
                assert (await c.trajectory(t.id)).token_ids == t.token_ids


def test_a_json_answer_still_reads_as_packed(gateway, settings):
    """A gateway that ignores Accept (an older one) answers JSON: the client packs it itself."""
    with RolloutClient(gateway.url, compact=False) as c, RunningWorker(settings):
        bid = c.submit(TASKS, env="math", group_size=1).id
        c.wait(bid, poll_s=0.05, timeout=60)
        for p, t in zip(c.packed_trajectories(bid), c.trajectories(bid)):
            assert as_numpy(p.samples()[0])[0].tolist() == t.token_ids
