"""A live worker and the queue's scheduling: it sleeps on the queue until work arrives, and a
small tenant's batch is not stuck behind a large tenant's one."""

from __future__ import annotations

import asyncio

from scheduler.queue import Queue
from scheduler.store import Store
from tests.conftest import RunningWorker
from tests.rollout_service.test_worker import wait_done
from wire import RolloutRequest, TrajectoryState


async def blocked_in_redis(redis) -> None:
    while not any(c.get("cmd") == "blpop" for c in await redis.client_list()):
        await asyncio.sleep(0.01)


async def event_seqs(store: Store, bid: str) -> list[int]:
    """When each of the batch's trajectories ended, as its event's stream id (server time)."""
    seqs, after = [], "0"
    while got := await store.events(bid, after, block_ms=1, count=1000):
        seqs += [e.seq for _, e in got if e is not None]
        after = got[-1][0]
    return seqs


async def test_an_idle_worker_blocked_on_the_queue_wakes_on_submit(settings, redis, keys):
    q, store = Queue(redis, keys), Store(redis, keys)
    with RunningWorker(settings, idle_wait_s=60):  # without a wake-up it would not look for a minute
        await blocked_in_redis(redis)
        b = await q.enqueue(RolloutRequest(tasks=[{"seed": 1}], env="math", group_size=2))
        st = await wait_done(store, b.id, timeout=30)
    assert st.counts[TrajectoryState.completed] + st.counts[TrajectoryState.truncated] == 2


async def test_tenant_bs_small_batch_finishes_while_tenant_as_huge_one_runs(settings, redis, keys):
    q, store = Queue(redis, keys), Store(redis, keys)
    huge = await q.enqueue(RolloutRequest(tasks=[{"seed": i} for i in range(100)], env="math", group_size=4),
                           tenant="a")
    with RunningWorker(settings, concurrency=4):
        while (await store.batch_status(huge.id)).counts[TrajectoryState.running] == 0:
            await asyncio.sleep(0.02)
        small = await q.enqueue(RolloutRequest(tasks=[{"seed": 1}], env="math", group_size=4), tenant="b")
        done = await wait_done(store, small.id, timeout=60)
    assert done.state.value == "completed"
    # Ordered by the batches' event streams (ids from Redis's one clock), not by when this test
    # got to look (a's trajectories take a millisecond or two: a look late by 0.2 s under load
    # saw a hundred more): one global FIFO would have finished all 400 of a's before b's last
    b_end = max(seq for seq in await event_seqs(store, small.id))
    a_before = sum(seq < b_end for seq in await event_seqs(store, huge.id))
    assert a_before < 100
