"""The SDK reads trajectories in the compact form (sync and async), into numpy and torch, from a
gateway whose results live in Redis or on disk; JSON when asked, or when that is all there is."""

from __future__ import annotations

import dataclasses

import httpx
import numpy as np
import pytest
import zstandard

from rollout_service.app import create_app
from rollout_service.routes.formats import packed_response
from scheduler.results import compress
from tests.conftest import LiveServer, RunningWorker
from trainer_client import AsyncRolloutClient, RolloutClient
from trainer_client.grpo import advantages, pack
from trainer_client.tensors import as_numpy, as_torch
from wire import Trajectory, TrajectoryState, Turn
from wire.packed import MEDIA_TYPE, pack_trajectory

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


def framed_page(n: int) -> tuple[list[bytes], list[str]]:
    """A page of `n` trajectories as the gateway sends it with zstd (several frames back to back),
    cut into chunks that end exactly where each frame ends, and the trajectories' ids."""
    ids = [f"b-{i}-0" for i in range(n)]
    turn = Turn(index=0, prompt_ids=[1, 2], output_ids=[3], output_logprobs=[-0.5], finish_reason="stop",
                policy_version=0, engine_id="e")
    stored = [compress(pack_trajectory(Trajectory(id=t, batch_id="b", group_index=i, sample_index=0, env="calc",
                                                  task={}, state=TrajectoryState.completed, turns=[turn])))
              for i, t in enumerate(ids)]
    body = packed_response(stored, zstd=True, page=(None,)).body
    chunks, rest = [], body
    while rest:  # frame by frame: each chunk is exactly one frame
        d = zstandard.ZstdDecompressor().decompressobj()
        d.decompress(rest)
        chunks.append(rest[:len(rest) - len(d.unused_data)])
        rest = d.unused_data
    return chunks, ids


def framed(chunks: list[bytes], seen: list[str], asynchronous: bool = False):
    headers = {"content-type": MEDIA_TYPE, "content-encoding": "zstd"}

    async def agen():
        for c in chunks:
            yield c

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return httpx.Response(200, headers=headers, content=agen() if asynchronous else iter(chunks))
    return handle


def test_a_zstd_frame_ending_at_a_read_boundary_reads_whole():
    """httpx's own decoder fails on this body ("cannot use a decompressobj multiple times"); the
    client opens the frames itself, so the page reads at the first try."""
    chunks, ids = framed_page(3)
    assert len(chunks) >= 4  # the page's head, three trajectories (and its tail)
    with pytest.raises(httpx.DecodingError):
        with httpx.Client(transport=httpx.MockTransport(framed(chunks, []))) as raw:
            raw.get("http://gw/v1/batches/b/trajectories")
    seen: list[str] = []
    with RolloutClient("http://gw", transport=httpx.MockTransport(framed(chunks, seen)), retries=0) as c:
        assert [p.id for p in c.packed_trajectories("b")] == ids
    assert seen == ["/v1/batches/b/trajectories"]


async def test_the_async_client_reads_the_frames_the_same_way():
    chunks, ids = framed_page(3)
    seen: list[str] = []
    transport = httpx.MockTransport(framed(chunks, seen, asynchronous=True))
    async with AsyncRolloutClient("http://gw", transport=transport, retries=0) as c:
        assert [p.id async for p in c.packed_trajectories("b")] == ids
    assert len(seen) == 1
