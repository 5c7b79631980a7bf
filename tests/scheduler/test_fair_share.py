"""What the queue claims next, against a real Redis: fair share across tenants (weights, a
running cap), priorities, GRPO groups together, longest-expected first, wake-ups, stale ids."""

from __future__ import annotations

import asyncio

import pytest

from scheduler.keys import batch_of
from scheduler.queue import Queue
from wire import RolloutRequest, Trajectory, TrajectoryState


def request(n_tasks=1, group=1, env="math", **kw) -> RolloutRequest:
    return RolloutRequest(tasks=[{"seed": i} for i in range(n_tasks)], env=env, group_size=group, **kw)


def done(tid: str) -> Trajectory:
    return Trajectory(id=tid, batch_id=batch_of(tid), group_index=0, sample_index=0, env="math", task={},
                      state=TrajectoryState.completed, reward=1.0)


@pytest.fixture
def queue(redis, keys) -> Queue:
    return Queue(redis, keys, lease_s=30)


async def claim_batches(queue: Queue, n: int) -> list[str]:
    return [batch_of((await queue.claim("w")).trajectory_id) for _ in range(n)]


async def test_a_tenant_with_nothing_running_goes_before_a_busy_one(queue):
    a = await queue.enqueue(request(100), tenant="a")
    assert await claim_batches(queue, 5) == [a.id] * 5
    b = await queue.enqueue(request(3), tenant="b")
    # a has 5 running, b none: b's three go next although a's batch is older
    assert await claim_batches(queue, 4) == [b.id, b.id, b.id, a.id]


async def test_weights_split_the_claims(queue):
    a = await queue.enqueue(request(100), tenant="a", weight=3)
    b = await queue.enqueue(request(100), tenant="b", weight=1)
    got = await claim_batches(queue, 40)
    assert got.count(a.id) == 30 and got.count(b.id) == 10


async def test_a_tenant_at_its_running_cap_waits_and_a_finish_frees_a_slot(queue, redis, keys):
    await queue.enqueue(request(5), tenant="a", max_running=2)
    first = [await queue.claim("w") for _ in range(2)]
    assert await queue.claim("w") is None  # at the cap: the rest stay queued
    assert await queue.depth() == 3
    await redis.delete(keys.wake)
    assert await queue.complete(first[0], done(first[0].trajectory_id))
    assert await redis.llen(keys.wake) == 1  # an idle worker is told a slot came free
    assert await queue.claim("w") is not None and await queue.claim("w") is None


async def test_priority_orders_a_tenants_batches(queue):
    low = await queue.enqueue(request(2, priority=-1))
    plain = await queue.enqueue(request(2))
    high = await queue.enqueue(request(2, priority=5))
    assert await claim_batches(queue, 6) == [high.id] * 2 + [plain.id] * 2 + [low.id] * 2


async def test_a_group_is_claimed_together_then_the_tenant_is_chosen_again(queue):
    a = await queue.enqueue(request(3, group=3), tenant="a")
    b = await queue.enqueue(request(3, group=3), tenant="b")
    got = [c.trajectory_id for c in await queue.claim_many("w", 8)]
    # a's first group whole, then b (now below a's share) its first group whole, then a again
    assert got == [f"{a.id}-0-{s}" for s in range(3)] + [f"{b.id}-0-{s}" for s in range(3)] + \
        [f"{a.id}-1-0", f"{a.id}-1-1"]
    assert len({c.token for c in await queue.claim_many("w", 3)}) == 3  # each claim its own lease token


async def test_a_requeued_member_goes_first_in_its_batch(queue):
    b = await queue.enqueue(request(2, group=2))
    c = await queue.claim("w")
    assert await queue.restart(c)
    assert (await queue.claim("w")).trajectory_id == f"{b.id}-0-0"


async def test_longest_expected_first_uses_the_reported_history(redis, keys):
    fifo, longest = Queue(redis, keys), Queue(redis, keys, longest_first=True)
    await longest.report_expected({"math": 4.0, "calc": 90.0})
    short = await longest.enqueue(request(2, env="math"))
    long = await longest.enqueue(request(2, env="calc"))
    assert await claim_batches(longest, 4) == [long.id] * 2 + [short.id] * 2
    first = await fifo.enqueue(request(2, env="math"))
    second = await fifo.enqueue(request(2, env="calc"))
    assert await claim_batches(fifo, 4) == [first.id] * 2 + [second.id] * 2


async def test_a_blocked_waiter_wakes_on_submit(queue, redis, keys):
    waiter = asyncio.create_task(queue.wait(60))
    while not any(c.get("cmd") == "blpop" for c in await redis.client_list()):
        await asyncio.sleep(0.01)  # until it really blocks in Redis
    assert not waiter.done()
    await queue.enqueue(request(1))
    assert await asyncio.wait_for(waiter, 30) is True  # woken, not timed out (60 s)
    assert await queue.claim("w") is not None


async def test_cancelled_ids_are_dropped_and_the_tenant_leaves_the_order(queue, redis, keys):
    gone = await queue.enqueue(request(4), tenant="a")
    await queue.cancel(gone.id)
    assert await redis.zcard(keys.tenants) == 0 and await queue.depth() == 0
    kept = await queue.enqueue(request(1), tenant="a")
    assert (await queue.claim("w")).trajectory_id == f"{kept.id}-0-0"
    assert await queue.claim("w") is None


async def test_ids_left_in_the_old_global_list_are_moved_and_claimed(queue, redis, keys):
    b = await queue.enqueue(request(2))
    await redis.delete(keys.batch_ready(b.id), keys.tenant_ready("default"), keys.tenants)
    await redis.rpush(keys.legacy_queue, f"{b.id}-0-0", f"{b.id}-1-0")  # as an old version left them
    assert await queue.claim("w") is None
    await queue.reap()
    assert {(await queue.claim("w")).trajectory_id for _ in range(2)} == {f"{b.id}-0-0", f"{b.id}-1-0"}
    assert not await redis.exists(keys.legacy_queue)


async def test_a_claim_looks_past_a_hundred_tenants_at_their_cap(queue):
    for i in range(120):  # heavy weights keep them first in the order, but each is at its cap of 1
        await queue.enqueue(request(2), tenant=f"capped-{i:03d}", weight=100, max_running=1)
    assert len(await queue.claim_many("w", 500)) == 120
    free = await queue.enqueue(request(3), tenant="free")
    got = [await queue.claim("w") for _ in range(3)]
    assert all(c is not None and batch_of(c.trajectory_id) == free.id for c in got)
