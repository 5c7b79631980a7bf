"""Result stores against a real Redis and a real directory: where a result lands, what Redis
records, a lost race leaving nothing behind, and results written under another store (or as
JSON, before the compact form) still read back."""

from __future__ import annotations

import asyncio

import pytest

from scheduler.queue import Queue
from scheduler.results import BLOB, ZSTD, FileResults, RedisResults, S3Results, plain, result_store
from scheduler.store import Store
from wire import RolloutRequest, Trajectory, TrajectoryState, Turn
from tests.scheduler.conftest import s3_keys
from wire.packed import unpack, unpack_trajectory


def request_(n_tasks=1, group=2, **kw) -> RolloutRequest:
    return RolloutRequest(tasks=[{"seed": i} for i in range(n_tasks)], env="math", group_size=group, **kw)


def result(tid: str, reward: float = 1.0) -> Trajectory:
    turns = [Turn(index=i, prompt_ids=list(range(100 * i, 100 * i + 50)), output_ids=[7, 8, 9],
                  output_logprobs=[-0.5, -0.25, -1.0], finish_reason="stop", policy_version=2, engine_id="e")
             for i in range(3)]
    return Trajectory(id=tid, batch_id=tid.split("-")[0], group_index=0, sample_index=int(tid.rsplit("-", 1)[1]),
                      env="math", task={"seed": 0}, state=TrajectoryState.completed, reward=reward, turns=turns)


@pytest.fixture(params=["redis", "file", "s3"])
def results(request, tmp_path):
    if request.param == "s3":
        return result_store(f"s3://{request.getfixturevalue('s3')}/runs/r1")
    return RedisResults() if request.param == "redis" else FileResults(tmp_path / "results")


async def test_a_result_reads_back_exactly_from_either_store(redis, keys, results, tmp_path):
    q, store = Queue(redis, keys, results=results), Store(redis, keys, results)
    b = await q.enqueue(request_())
    c = await q.claim("w1")
    assert await q.complete(c, result(c.trajectory_id, 0.25))
    recorded = await redis.hget(keys.traj(c.trajectory_id), "result")
    if isinstance(results, FileResults):
        files = list((tmp_path / "results" / b.id).iterdir())
        assert recorded == BLOB + f"{b.id}/{files[0].name}".encode() and len(files) == 1
        assert files[0].read_bytes()[:4] == ZSTD
    elif isinstance(results, S3Results):
        objects = s3_keys(results.bucket)
        assert len(objects) == 1 and objects[0] == "runs/r1/" + recorded[len(BLOB):].decode()
        assert objects[0].startswith(f"runs/r1/{b.id}/{c.trajectory_id}.")
    else:
        assert recorded[:4] == ZSTD  # inline, compressed
    assert await store.trajectory(c.trajectory_id) == result(c.trajectory_id, 0.25)
    assert unpack(unpack_trajectory(plain(await store.trajectory_packed(c.trajectory_id)))) == \
        result(c.trajectory_id, 0.25)
    page, _ = await store.trajectories(b.id)
    assert [t.state for t in page] == [TrajectoryState.completed, TrajectoryState.queued]


@pytest.mark.parametrize("kind", ["file", "s3"])
async def test_a_writer_that_lost_its_lease_leaves_no_blob(redis, keys, tmp_path, request, kind):
    results = FileResults(tmp_path) if kind == "file" else S3Results(request.getfixturevalue("s3"))

    def blobs() -> list[str]:
        if kind == "file":
            return [p.name for p in tmp_path.rglob("*.msgpack")]
        return s3_keys(results.bucket)

    q, store = Queue(redis, keys, lease_s=0.3, results=results), Store(redis, keys, results)
    await q.enqueue(request_(group=1))
    dead = await q.claim("dying")
    await asyncio.sleep(0.4)
    assert await q.reap() == (1, 0)
    alive = await q.claim("w2")
    assert not await q.complete(dead, result(dead.trajectory_id, 0.0))  # too late: its blob is dropped
    assert blobs() == []
    assert await q.complete(alive, result(alive.trajectory_id, 1.0))
    assert len(blobs()) == 1 and alive.token in blobs()[0]
    assert (await store.trajectory(alive.trajectory_id)).reward == 1.0


async def test_results_written_before_a_switch_stay_readable(redis, keys, tmp_path):
    q = Queue(redis, keys)  # inline first
    b = await q.enqueue(request_())
    c = await q.claim("w1")
    await q.complete(c, result(c.trajectory_id))
    store = Store(redis, keys, FileResults(tmp_path))  # then the deployment moves to files
    assert await store.trajectory(c.trajectory_id) == result(c.trajectory_id)
    assert (await store.trajectories(b.id))[0][0] == result(c.trajectory_id)


@pytest.mark.parametrize("which", ["redis", "file"])
async def test_a_result_stored_as_json_before_the_compact_form_reads_back(redis, keys, tmp_path, which):
    q = Queue(redis, keys)
    await q.enqueue(request_(group=1))
    c = await q.claim("w1")
    await q.complete(c, result(c.trajectory_id))
    old = result(c.trajectory_id).model_copy(update={"reward": 0.75})
    await redis.hset(keys.traj(c.trajectory_id), "result", old.model_dump_json())  # as the old code stored it
    store = Store(redis, keys, RedisResults() if which == "redis" else FileResults(tmp_path))
    assert await store.trajectory(c.trajectory_id) == old
    assert unpack(unpack_trajectory(plain(await store.trajectory_packed(c.trajectory_id)))) == old


@pytest.mark.parametrize("kind", ["file", "s3"])
async def test_a_blob_that_is_gone_reads_as_a_missing_trajectory(redis, keys, tmp_path, request, kind):
    results = FileResults(tmp_path) if kind == "file" else S3Results(request.getfixturevalue("s3"), "p")
    q, store = Queue(redis, keys, results=results), Store(redis, keys, results)
    b = await q.enqueue(request_(group=1))
    c = await q.claim("w1")
    await q.complete(c, result(c.trajectory_id))
    await results.drop_batch(b.id)
    assert await store.trajectory(c.trajectory_id) is None
    assert await store.trajectories(b.id) == ([], None)


def test_result_store_urls(tmp_path):
    assert isinstance(result_store("redis"), RedisResults) and isinstance(result_store(""), RedisResults)
    assert isinstance(result_store(f"file://{tmp_path}/r"), FileResults) and (tmp_path / "r").is_dir()
    assert isinstance(result_store("s3://bucket/some/prefix"), S3Results)
    assert result_store("s3://bucket/some/prefix/").prefix == "some/prefix/"
    for bad in ("s3://", "file://", "mysql://x"):
        with pytest.raises(ValueError):
            result_store(bad)


async def test_keys_that_are_not_ours_never_become_paths(tmp_path):
    results = FileResults(tmp_path / "r")
    for bad in (b"blob:../../etc/passwd", b"blob:a/b/c", b"blob:/abs"):
        with pytest.raises(ValueError):
            await results.get([bad])
    with pytest.raises(ValueError):
        await results.put("..", "t", "x", b"x")


async def test_a_finish_retried_after_its_reply_was_lost_keeps_its_result(redis, keys, results):
    """The script ran, the reply never came, the worker writes again: the same result is
    recognised as recorded (True), counted once, and its blob is not discarded as a loser's."""
    q, store = Queue(redis, keys, results=results), Store(redis, keys, results)
    b = await q.enqueue(request_(group=1))
    c = await q.claim("w1")
    assert await q.complete(c, result(c.trajectory_id))
    assert await q.complete(c, result(c.trajectory_id))  # the same write again
    if isinstance(results, RedisResults):  # (a blob's key is the lease's: its holder writes one result)
        assert not await q.complete(c, result(c.trajectory_id, reward=0.5))  # a different one still loses
    assert await store.trajectory(c.trajectory_id) == result(c.trajectory_id)
    st = await store.batch_status(b.id)
    assert st.counts[TrajectoryState.completed] == 1 and st.state.value == "completed"


async def test_a_large_result_is_stored_harder_and_reads_back_the_same():
    """Small results: zstd's fast default, inline. From LARGE bytes: a higher level, in a thread."""
    from benchmarks.payload import synthetic
    from scheduler.results import FAST_LEVEL, LARGE, compress, compress_result
    from wire.packed import pack_trajectory
    import numpy as np

    small = pack_trajectory(result("b-0-0"))
    assert len(small) < LARGE and await compress_result(small) == compress(small, FAST_LEVEL)
    large = pack_trajectory(synthetic(np.random.default_rng(0), 8192))  # the payload benchmark's shape
    assert len(large) >= LARGE
    stored = await compress_result(large)
    assert stored[:4] == ZSTD and plain(stored) == large
    assert len(stored) < 0.95 * len(compress(large, FAST_LEVEL))


async def test_results_of_one_moment_are_packed_together_and_one_that_cannot_be_fails_alone(
        redis, keys, monkeypatch):
    """Inline results are packed, counted and compressed as their finishing call goes out; the
    finishes of one moment share that call. A trajectory whose packing raises fails its own
    `complete`; the others of its call are recorded, large ones stored harder as ever."""
    from benchmarks.payload import synthetic
    import numpy as np

    import scheduler.queue as queue_mod
    from scheduler.results import FAST_LEVEL, LARGE, LARGE_LEVEL, compress

    q, store = Queue(redis, keys), Store(redis, keys)
    b = await q.enqueue(request_(n_tasks=2, group=2))
    claims = await q.claim_many("w1", 4)
    bad = claims[1].trajectory_id
    real_pack = queue_mod.pack_trajectory

    def pack(traj, **kw):
        if traj.id == bad:
            raise ValueError("cannot pack this one")
        return real_pack(traj, **kw)

    monkeypatch.setattr(queue_mod, "pack_trajectory", pack)
    sends = []
    real_send = q._finishes._send
    q._finishes._send = lambda items: sends.append(len(items)) or real_send(items)
    large = synthetic(np.random.default_rng(0), 8192).model_copy(update={
        "id": claims[2].trajectory_id, "batch_id": b.id, "group_index": 1, "sample_index": 0})
    trajs = [result(claims[0].trajectory_id), result(bad), large, result(claims[3].trajectory_id, 0.5)]
    got = await asyncio.gather(*(q.complete(c, t) for c, t in zip(claims, trajs)), return_exceptions=True)
    assert got[0] is True and isinstance(got[1], ValueError) and got[2] is True and got[3] is True
    assert sends == [3]  # one call, the failed one left out
    for c, t in zip(claims, trajs):
        if c.trajectory_id != bad:
            assert await store.trajectory(c.trajectory_id) == t
    stored = {c.trajectory_id: await redis.hget(keys.traj(c.trajectory_id), "result") for c in claims}
    assert stored[claims[0].trajectory_id] == compress(real_pack(trajs[0], samples=False), FAST_LEVEL)
    assert len(real_pack(large, samples=False)) >= LARGE
    assert stored[claims[2].trajectory_id] == compress(real_pack(large, samples=False), LARGE_LEVEL)
    st = await store.batch_status(b.id)
    assert st.counts[TrajectoryState.completed] == 3 and st.counts[TrajectoryState.running] == 1
    assert (await redis.hgetall(keys.stats)).get(b"tokens:sampled") == str(9 + 9 + sum(
        len(t.output_ids) for t in large.turns)).encode()
