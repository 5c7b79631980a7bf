"""Finished batches expire after the retention, with every key and blob of theirs; nothing
unfinished, nothing too young, and nothing of another batch goes with them."""

from __future__ import annotations

import time

import pytest

from scheduler.queue import Queue
from scheduler.results import FileResults, RedisResults, S3Results
from scheduler.retention import Retention
from scheduler.store import Store
from tests.scheduler.conftest import s3_keys
from wire import RolloutRequest, Trajectory, TrajectoryState, Turn

HOUR = 3600.0


def batch(**kw) -> RolloutRequest:
    return RolloutRequest(tasks=[{"seed": 0}], env="math", group_size=2, **kw)


def done(tid: str) -> Trajectory:
    return Trajectory(id=tid, batch_id=tid.split("-")[0], group_index=0, sample_index=0, env="math", task={},
                      state=TrajectoryState.completed, reward=1.0,
                      turns=[Turn(index=0, prompt_ids=[1], output_ids=[2], output_logprobs=[-0.5],
                                  finish_reason="stop", policy_version=0, engine_id="e")])


async def finish_all(q: Queue) -> None:
    while (c := await q.claim("w")) is not None:
        assert await q.complete(c, done(c.trajectory_id))


async def our_keys(redis, prefix: str) -> set[str]:
    return {k.decode() for k in await redis.keys(f"{prefix}*")}


@pytest.mark.parametrize("kind", ["redis", "file", "s3"])
async def test_a_finished_batch_goes_after_the_retention_with_all_it_had(redis, keys, prefix, tmp_path, kind, request):
    results = {"redis": RedisResults, "file": lambda: FileResults(tmp_path),
               "s3": lambda: S3Results(request.getfixturevalue("s3"), "kept")}[kind]()
    q, store = Queue(redis, keys, results=results), Store(redis, keys, results)
    before = await our_keys(redis, prefix)
    gone = await q.enqueue(batch(idempotency_key="step-1"), tenant="team-a")
    await finish_all(q)
    kept = await q.enqueue(batch(), tenant="team-a")  # unfinished (one of its two done), just as old
    one = await q.claim("w")
    assert await q.complete(one, done(one.trajectory_id))
    batch_keys = await our_keys(redis, prefix) - before
    assert {keys.batch(gone.id), keys.traj(f"{gone.id}-0-1"), keys.batch_events(gone.id)} <= batch_keys
    finished_at = (await store.batch_status(gone.id)).finished_at
    r = Retention(redis, keys, results, retention_s=HOUR)

    assert await r.sweep(now=finished_at + HOUR - 1) == []  # not yet
    assert await store.batch_status(gone.id) is not None
    assert await r.sweep(now=finished_at + HOUR + 1) == [gone.id]

    assert await store.batch_status(gone.id) is None and await store.trajectory(f"{gone.id}-0-0") is None
    left = await our_keys(redis, prefix)
    assert not {k for k in left if gone.id in k}  # every key naming the batch, the idempotency key too
    assert await store.list_batches() == [kept.id] and await store.list_batches(tenant="team-a") == [kept.id]
    assert (await store.trajectory(one.trajectory_id)).state is TrajectoryState.completed
    if kind == "file":
        assert not (tmp_path / gone.id).exists() and len(list((tmp_path / kept.id).iterdir())) == 1
    if kind == "s3":
        assert [k.split("/")[1] for k in s3_keys(results.bucket)] == [kept.id]
    again = await q.enqueue(batch(idempotency_key="step-1"), tenant="team-a")
    assert again.created and again.id != gone.id  # the key was freed with its batch


async def test_retention_zero_keeps_everything(redis, keys):
    q = Queue(redis, keys)
    b = await q.enqueue(batch())
    await finish_all(q)
    assert await Retention(redis, keys, RedisResults(), retention_s=0).sweep(now=time.time() + 10 * 365 * 86400) == []
    assert await Store(redis, keys).batch_status(b.id) is not None


async def test_a_sweep_steps_over_old_unfinished_batches_to_reach_finished_ones(redis, keys):
    q, store = Queue(redis, keys), Store(redis, keys)
    unfinished = [await q.enqueue(batch()) for _ in range(3)]  # older, never finished
    for b in unfinished:
        await redis.hset(keys.batch(b.id), "state", "running")
    claimed = [await q.claim("w") for _ in range(6)]  # every trajectory of the three, held
    last = await q.enqueue(batch())
    await finish_all(q)
    r = Retention(redis, keys, RedisResults(), retention_s=1.0, scan=2)
    later = time.time() + 60
    swept = [await r.sweep(now=later) for _ in range(3)]
    assert [last.id] in swept and sum(len(s) for s in swept) == 1
    assert None not in [await store.batch_status(b.id) for b in unfinished]
    assert all(c is not None for c in claimed)
