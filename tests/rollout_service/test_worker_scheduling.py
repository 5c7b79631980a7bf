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
        a = await store.batch_status(huge.id)
    assert done.state.value == "completed"
    # one global FIFO would have run all 400 of a's first
    assert a.finished_at is None and a.counts[TrajectoryState.queued] > 300
