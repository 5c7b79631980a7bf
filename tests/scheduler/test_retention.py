"""Finished batches expire after the retention, with every key and blob of theirs; nothing
unfinished, nothing too young, and nothing of another batch goes with them."""

from __future__ import annotations

import time

import pytest

from scheduler.queue import Queue
from scheduler.results import FileResults, RedisResults
from scheduler.retention import Retention
from scheduler.store import Store
from wire import RolloutRequest, Trajectory, TrajectoryState, Turn

HOUR = 3600.0


def request(**kw) -> RolloutRequest:
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


@pytest.mark.parametrize("kind", ["redis", "file"])
async def test_a_finished_batch_goes_after_the_retention_with_all_it_had(redis, keys, prefix, tmp_path, kind):
    results = RedisResults() if kind == "redis" else FileResults(tmp_path)
    q, store = Queue(redis, keys, results=results), Store(redis, keys, results)
    before = await our_keys(redis, prefix)
    gone = await q.enqueue(request(idempotency_key="step-1"), tenant="team-a")
    await finish_all(q)
    kept = await q.enqueue(request(), tenant="team-a")  # unfinished, just as old
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
    assert await store.batch_status(kept.id) is not None and await store.trajectory(f"{kept.id}-0-0") is not None
    if kind == "file":
        assert not (tmp_path / gone.id).exists()
    again = await q.enqueue(request(idempotency_key="step-1"), tenant="team-a")
    assert again.created and again.id != gone.id  # the key was freed with its batch


async def test_retention_zero_keeps_everything(redis, keys):
    q = Queue(redis, keys)
    b = await q.enqueue(request())
    await finish_all(q)
    assert await Retention(redis, keys, RedisResults(), retention_s=0).sweep(now=time.time() + 10 * 365 * 86400) == []
    assert await Store(redis, keys).batch_status(b.id) is not None


async def test_a_sweep_steps_over_old_unfinished_batches_to_reach_finished_ones(redis, keys):
    q, store = Queue(redis, keys), Store(redis, keys)
    unfinished = [await q.enqueue(request()) for _ in range(3)]  # older, never finished
    for b in unfinished:
        await redis.hset(keys.batch(b.id), "state", "running")
    claimed = [await q.claim("w") for _ in range(6)]  # every trajectory of the three, held
    last = await q.enqueue(request())
    await finish_all(q)
    r = Retention(redis, keys, RedisResults(), retention_s=1.0, scan=2)
    later = time.time() + 60
    swept = [await r.sweep(now=later) for _ in range(3)]
    assert [last.id] in swept and sum(len(s) for s in swept) == 1
    assert None not in [await store.batch_status(b.id) for b in unfinished]
    assert all(c is not None for c in claimed)
