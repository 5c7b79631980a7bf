"""The queue against a real Redis: leases, expiry, retries, idempotency, cancel."""

from __future__ import annotations

import asyncio
import time

import pytest

from scheduler.keys import batch_of, trajectory_id
from scheduler.queue import IdempotencyConflict, LeaseLost, Queue
from scheduler.store import Store
from scheduler.jobs import IllegalTransition
from wire import Failure, FailureKind, RolloutRequest, Trajectory, TrajectoryState, Turn


def request(n_tasks=2, group=2, **kw) -> RolloutRequest:
    return RolloutRequest(tasks=[{"seed": i} for i in range(n_tasks)], env="math", group_size=group, **kw)


def finished(tid: str, state=TrajectoryState.completed, reward=1.0) -> Trajectory:
    return Trajectory(id=tid, batch_id=tid.split("-")[0], group_index=0, sample_index=0, env="math", task={},
                      state=state, reward=reward)


@pytest.fixture
def queue(redis, keys) -> Queue:
    return Queue(redis, keys, lease_s=0.3, max_attempts=2, max_restarts=2)


@pytest.fixture
def store(redis, keys) -> Store:
    return Store(redis, keys)


async def test_enqueue_expands_tasks_times_group(queue, store):
    b = await queue.enqueue(request(3, 4))
    assert b.created and b.num_trajectories == 12
    st = await store.batch_status(b.id)
    assert st.counts[TrajectoryState.queued] == 12 and st.state.value == "queued"
    page, nxt = await store.trajectories(b.id, 0, 5)
    assert [t.id for t in page] == [f"{b.id}-0-0", f"{b.id}-0-1", f"{b.id}-0-2", f"{b.id}-0-3", f"{b.id}-1-0"]
    assert nxt == 5


async def test_enqueue_names_and_lists_every_trajectory_as_the_keys_define(queue, store, redis, keys):
    """The script names the trajectories (`trajectory_id`) and lists them in a few pushes: 301 groups
    of 2 cross a push's 500 ids; each has its own group, sample and task."""
    b = await queue.enqueue(request(301, 2))
    want = [trajectory_id(b.id, g, s) for g in range(301) for s in range(2)]
    assert [x.decode() for x in await redis.lrange(keys.batch_trajs(b.id), 0, -1)] == want
    assert [x.decode() for x in await redis.lrange(keys.batch_ready(b.id), 0, -1)] == want
    assert {batch_of(t) for t in want} == {b.id} and await queue.depth() == 602
    for g, s in ((0, 0), (249, 1), (250, 0), (300, 1)):
        w = await store.work(trajectory_id(b.id, g, s))
        assert (w.batch_id, w.group_index, w.sample_index, w.task) == (b.id, g, s, {"seed": g})


async def test_same_idempotency_key_returns_same_batch(queue, store, redis, keys):
    a = await queue.enqueue(request(idempotency_key="step-7"))
    b = await queue.enqueue(request(idempotency_key="step-7"))
    assert a.id == b.id and a.created and not b.created and b.num_trajectories == 4
    assert await queue.depth() == 4  # no duplicate trajectories queued
    assert len(await store.list_batches()) == 1


async def test_an_idempotency_key_reused_for_another_request_is_refused(queue, store, redis, keys):
    a = await queue.enqueue(request(idempotency_key="step-7"))
    with pytest.raises(IdempotencyConflict, match=a.id):
        await queue.enqueue(request(n_tasks=1, idempotency_key="step-7"))
    assert await queue.depth() == 4 and len(await store.list_batches()) == 1
    # a batch enqueued before fingerprints has none: a resubmission is taken as the same request
    await redis.hdel(keys.batch(a.id), "fingerprint")
    b = await queue.enqueue(request(n_tasks=1, idempotency_key="step-7"))
    assert b.id == a.id and not b.created


async def test_claim_complete_counts_and_first_result_wins(queue, store):
    b = await queue.enqueue(request(1, 1))
    c = await queue.claim("w1")
    assert c.trajectory_id == f"{b.id}-0-0" and c.attempt == 1
    assert (await store.batch_status(b.id)).counts[TrajectoryState.running] == 1
    assert await queue.complete(c, finished(c.trajectory_id, reward=0.5))
    assert not await queue.complete(c, finished(c.trajectory_id, reward=0.9))  # late duplicate dropped
    st = await store.batch_status(b.id)
    assert st.state.value == "completed" and st.counts[TrajectoryState.completed] == 1 and st.finished_at
    assert (await store.trajectory(c.trajectory_id)).reward == 0.5


async def test_expired_lease_is_reclaimed_by_another_worker(queue, store):
    b = await queue.enqueue(request(1, 1))
    dead = await queue.claim("dying-worker")
    assert await queue.claim("w2") is None
    await asyncio.sleep(0.4)  # lease_s=0.3 lapses: the dying worker never heartbeats
    assert await queue.reap() == (1, 0)
    alive = await queue.claim("w2")
    # a dead worker is our fault: a restart, not one of the trajectory's attempts
    assert alive.trajectory_id == dead.trajectory_id and (alive.attempt, alive.restarts) == (1, 1)
    with pytest.raises(LeaseLost):
        await queue.heartbeat(dead)
    assert not await queue.complete(dead, finished(dead.trajectory_id))  # stale holder cannot write
    assert await queue.complete(alive, finished(alive.trajectory_id))
    assert (await store.batch_status(b.id)).counts[TrajectoryState.completed] == 1


def turn(i: int, engine: str = "e0") -> Turn:
    return Turn(index=i, prompt_ids=[1, 2], output_ids=[3 + i], output_logprobs=[-0.5], finish_reason="stop",
                policy_version=0, engine_id=engine)


async def test_a_finish_sent_again_after_its_reply_was_lost_reads_as_recorded_and_counts_once(queue, store, redis, keys):
    b = await queue.enqueue(request(1, 2))
    c = await queue.claim("w1")
    t = finished(c.trajectory_id, reward=0.5)
    assert await queue.complete(c, t)
    assert await queue.complete(c, t)  # the very same write again: recorded already, not a loser's
    st = await store.batch_status(b.id)
    assert st.counts[TrajectoryState.completed] == 1 and st.finished_at is None
    assert int(await redis.hget(keys.batch(b.id), "n_done")) == 1
    assert int(await redis.hget(keys.stats, "finished:completed")) == 1
    finished_at = float(await redis.hget(keys.traj(c.trajectory_id), "finished_at"))
    assert abs(finished_at - time.time()) < 60  # a time, as the worker sent it


async def test_a_running_trajectory_shows_its_recorded_turns(queue, store, redis, keys):
    b = await queue.enqueue(request(1, 1))
    c = await queue.claim("w1")
    tid = c.trajectory_id
    await queue.append_turn(c, turn(0))
    await queue.append_turn(c, turn(1))
    await queue.append_turn(c, turn(1))  # the same write again (retried after a timeout): no duplicate
    t = await store.trajectory(tid)
    assert t.state is TrajectoryState.running and [x.index for x in t.turns] == [0, 1]
    assert [x.output_ids for x in t.turns] == [[3], [4]]
    with pytest.raises(IllegalTransition):
        await queue.append_turn(c, turn(3))  # never a gap
    page, _ = await store.trajectories(b.id)
    assert len(page[0].turns) == 2
    done = finished(tid).model_copy(update={"turns": [turn(0), turn(1), turn(2)]})
    assert await queue.complete(c, done)
    assert [x.index for x in (await store.trajectory(tid)).turns] == [0, 1, 2]  # the result's, once
    assert not await redis.exists(keys.traj_turns(tid))  # the live list is gone with the attempt


async def test_a_rerun_starts_from_no_turns_and_a_stale_writer_appends_nothing(queue, store):
    await queue.enqueue(request(1, 1))
    dead = await queue.claim("dying-worker")
    await queue.append_turn(dead, turn(0, "dead"))
    await asyncio.sleep(0.4)  # the lease lapses
    assert await queue.reap() == (1, 0)
    t = await store.trajectory(dead.trajectory_id)
    assert t.state is TrajectoryState.queued and t.turns == []  # requeued: the lost attempt's turns are gone
    alive = await queue.claim("w2")
    with pytest.raises(LeaseLost):
        await queue.append_turn(dead, turn(1, "dead"))  # without the current lease: nothing written
    with pytest.raises(LeaseLost):
        await queue.append_turn(dead, turn(0, "dead"))
    await queue.append_turn(alive, turn(0, "alive"))
    assert [x.engine_id for x in (await store.trajectory(alive.trajectory_id)).turns] == ["alive"]
    assert await queue.restart(alive)  # a restart (and a retry) drops them the same way
    assert (await store.trajectory(alive.trajectory_id)).turns == []


async def test_heartbeat_keeps_the_lease(queue):
    await queue.enqueue(request(1, 1))
    c = await queue.claim("w1")
    for _ in range(4):
        await asyncio.sleep(0.15)
        assert await queue.heartbeat(c)
    assert await queue.reap() == (0, 0)


async def test_one_heartbeat_call_renews_many_leases_and_says_which_ended(queue, redis, keys, monkeypatch):
    import scheduler.queue as qmod

    monkeypatch.setattr(qmod, "HEARTBEAT_CHUNK", 2)  # 5 claims: 3 script calls (one round trip), in order
    keep = await queue.enqueue(request(2, 1))
    gone = await queue.enqueue(request(2, 1))
    claims = await queue.claim_many("w1", 4)
    assert {c.batch_id for c in claims} == {keep.id, gone.id}
    await queue.cancel(gone.id)
    stale = qmod.Claim(claims[0].trajectory_id, "not-the-token", 1)
    calls = []
    real = queue._heartbeat

    async def counted(args, client=None):
        calls.append(len(args))
        return await real(args=args, client=client)

    monkeypatch.setattr(queue, "_heartbeat", counted)
    before = [await redis.zscore(keys.leases, c.trajectory_id) for c in claims]
    queue.lease_s = 60.0  # the renewal sets a deadline a minute out: visibly later than the claim's
    verdicts = await queue.heartbeat_many([*claims, stale])
    want = [qmod.BATCH_CANCELLED if c.batch_id == gone.id else qmod.LEASE_OK for c in claims]
    assert verdicts == [*want, qmod.LEASE_LOST] and calls == [6, 6, 4]
    after = [await redis.zscore(keys.leases, c.trajectory_id) for c in claims]
    assert all(a >= b + 50_000 for a, b in zip(after, before))  # every lease renewed


async def test_poison_work_fails_after_max_restarts_with_internal_kind(queue, store):
    b = await queue.enqueue(request(1, 1))
    reaped = []
    for _ in range(3):  # max_restarts=2: two lapses requeue, the third fails it
        assert await queue.claim("w") is not None
        await asyncio.sleep(0.35)
        reaped.append(await queue.reap())
    assert reaped == [(1, 0), (1, 0), (0, 1)]
    t = await store.trajectory(f"{b.id}-0-0")
    assert t.state is TrajectoryState.failed and t.failure.kind is FailureKind.internal
    assert "restarted 2 times" in t.failure.message and t.restarts == 2
    assert int(await queue.r.hget(queue.k.stats, "restarts")) == 2


async def test_restart_requeues_without_charging_an_attempt(queue, store):
    b = await queue.enqueue(request(1, 1))
    c = await queue.claim("w")
    assert await queue.restart(c)
    again = await queue.claim("w")
    assert (again.trajectory_id, again.attempt, again.restarts) == (c.trajectory_id, 1, 1)
    assert await queue.retry(again)  # a charged failure
    third = await queue.claim("w")
    assert (third.attempt, third.restarts) == (2, 1)
    assert (await store.trajectory(f"{b.id}-0-0")).restarts == 1
    assert not await queue.restart(c)  # a stale token cannot requeue


async def test_retry_requeues_within_budget(queue):
    await queue.enqueue(request(1, 1))
    c = await queue.claim("w")
    assert await queue.retry(c)
    again = await queue.claim("w")
    assert again.trajectory_id == c.trajectory_id and again.attempt == 2


async def test_cancel_ends_queued_and_flags_running(queue, store):
    b = await queue.enqueue(request(2, 1))
    running = await queue.claim("w")
    assert await queue.cancel(b.id) is True
    assert await queue.heartbeat(running) is False  # the holder learns of the cancel
    assert await queue.claim("w") is None  # the queued one is gone
    st = await store.batch_status(b.id)
    assert st.state.value == "cancelled" and st.counts[TrajectoryState.cancelled] == 1
    t = finished(running.trajectory_id, TrajectoryState.cancelled, None)
    t.failure = Failure(kind=FailureKind.cancelled, message="batch cancelled")
    assert await queue.complete(running, t)
    st = await store.batch_status(b.id)
    assert st.state.value == "cancelled" and st.finished_at is not None
    assert await queue.cancel("nope") is None and await queue.cancel(b.id) is False


async def test_events_stream_each_terminal_state_then_done(queue, store):
    b = await queue.enqueue(request(1, 2))
    for _ in range(2):
        c = await queue.claim("w")
        await queue.complete(c, finished(c.trajectory_id))
    events = await store.events(b.id, "0", block_ms=100)
    assert [e.trajectory_id for _, e in events[:2]] == [f"{b.id}-0-0", f"{b.id}-0-1"]
    assert events[-1][1] is None and len(events) == 3
    assert await store.events(b.id, events[0][0], block_ms=100) == events[1:]  # resumable by id


async def test_retry_with_backoff_waits_then_runs(queue):
    await queue.enqueue(request(1, 1))
    c = await queue.claim("w")
    await queue.retry(c, delay_s=0.3)
    assert await queue.claim("w") is None  # backing off
    await queue.reap()
    assert await queue.claim("w") is None  # not due yet
    await asyncio.sleep(0.35)
    await queue.reap()
    again = await queue.claim("w")
    assert again.trajectory_id == c.trajectory_id and again.attempt == 2


async def test_cancel_reaches_a_trajectory_backing_off(queue, store):
    b = await queue.enqueue(request(1, 1))
    await queue.retry(await queue.claim("w"), delay_s=60)
    await queue.cancel(b.id)
    assert (await store.batch_status(b.id)).counts[TrajectoryState.cancelled] == 1
    assert await queue.r.zcard(queue.k.delayed) == 0


async def test_complete_refuses_a_non_terminal_state(queue):
    from scheduler.jobs import IllegalTransition

    await queue.enqueue(request(1, 1))
    c = await queue.claim("w")
    with pytest.raises(IllegalTransition):
        await queue.complete(c, finished(c.trajectory_id, TrajectoryState.queued))
    with pytest.raises(IllegalTransition):
        await queue.complete(c, finished(c.trajectory_id, TrajectoryState.running))


async def test_a_tenants_open_count_follows_every_path_out(queue, store, redis, keys):
    from scheduler.queue import QuotaExceeded

    async def open_now(tenant="default") -> int:
        return int(await redis.get(keys.tenant_open(tenant)) or 0)

    b = await queue.enqueue(request(2, 2), max_open=5)
    assert await open_now() == 4
    with pytest.raises(QuotaExceeded) as refused:
        await queue.enqueue(request(1, 2), max_open=5)
    assert (refused.value.open, refused.value.requested, refused.value.limit) == (4, 2, 5)
    assert len(await store.list_batches()) == 1 and await queue.depth() == 4  # refused: nothing written
    assert await queue.enqueue(request(1, 2), tenant="other", max_open=5)  # another tenant's count
    assert await open_now("other") == 2

    c = await queue.claim("w")
    assert await open_now() == 4  # running is still open
    await queue.retry(c)
    assert await open_now() == 4  # so is queued again
    c = await queue.claim("w")
    await queue.complete(c, finished(c.trajectory_id))
    assert await open_now() == 3
    await queue.cancel(b.id)
    assert await redis.exists(keys.tenant_open("default")) == 0  # at 0 the key goes
    assert (await queue.enqueue(request(1, 5), max_open=5)).created


async def test_the_quota_holds_against_concurrent_enqueues(queue, store, redis, keys):
    from scheduler.queue import QuotaExceeded

    got = await asyncio.gather(*(queue.enqueue(request(2, 2), max_open=10) for _ in range(8)),
                               return_exceptions=True)
    assert sum(isinstance(g, QuotaExceeded) for g in got) == 6 and len(await store.list_batches()) == 2
    assert int(await redis.get(keys.tenant_open("default"))) == 8 == await queue.depth()


async def test_an_idempotent_resubmission_passes_a_full_quota(queue):
    a = await queue.enqueue(request(2, 2, idempotency_key="step-1"), max_open=4)
    b = await queue.enqueue(request(2, 2, idempotency_key="step-1"), max_open=4)
    assert a.id == b.id and not b.created and await queue.depth() == 4


async def test_a_restarted_worker_releases_what_its_predecessor_held(queue, store):
    b = await queue.enqueue(request(2, 1))
    held = await queue.claim("worker-0")
    other = await queue.claim("worker-1")
    assert await queue.release("worker-0") == (1, 0)  # at once, not a lease later
    again = await queue.claim("worker-0")
    assert (again.trajectory_id, again.attempt, again.restarts) == (held.trajectory_id, 1, 1)
    assert await queue.heartbeat(other)  # another worker's lease is untouched
    with pytest.raises(LeaseLost):
        await queue.heartbeat(held)
    assert (await store.batch_status(b.id)).counts[TrajectoryState.running] == 2


async def test_a_claimed_trajectorys_work_carries_its_batch_parameters_read_once(queue, store, redis, keys):
    a = await queue.enqueue(request(2, 1, max_turns=3))
    b = await queue.enqueue(RolloutRequest(tasks=[{"q": 1}], env="calc", max_turns=5))
    first = await store.work(f"{a.id}-0-0")
    assert (first.task, first.params.env, first.params.max_turns, first.group_index) == ({"seed": 0}, "math", 3, 0)
    await redis.hdel(keys.batch(a.id), "params")  # parsed once per batch: the next work of it reads no params
    again = await store.work(f"{a.id}-1-0")
    assert (again.task, again.params.max_turns, again.group_index) == ({"seed": 1}, 3, 1)
    other = await store.work(f"{b.id}-0-0")  # another batch reads its own
    assert (other.params.env, other.params.max_turns, other.task) == ("calc", 5, {"q": 1})


async def test_a_claim_brings_the_trajectorys_fields_so_its_work_needs_no_read(queue, store, redis, keys):
    b = await queue.enqueue(request(1, 2))
    c = await queue.claim("w")
    assert (c.batch_id, c.group_index, c.sample_index, c.task) == (b.id, 0, 0, '{"seed": 0}')
    await redis.hdel(keys.traj(c.trajectory_id), "task", "group", "sample")  # from the claim, not read again
    w = await store.work(c.trajectory_id, c)
    assert (w.trajectory_id, w.batch_id, w.group_index, w.sample_index, w.task) == (c.trajectory_id, b.id, 0, 0,
                                                                                      {"seed": 0})
    many = await queue.claim_many("w", 5)  # the rest of the batch, each with its own fields
    assert [(x.group_index, x.sample_index) for x in many] == [(0, 1)] and many[0].token != c.token


async def test_a_task_reaches_its_episode_as_submitted_whatever_json_it_holds(queue, store):
    """Tasks are parsed by pydantic-core's JSON reader, which refuses a lone surrogate that Python's
    `json` writes and reads (`\\ud800`; the gateway refuses one in a body, a Python caller can still
    send it): such a task still arrives whole, and so do big ints, extreme floats, nesting and
    non-ASCII text. (Non-finite floats are refused by the wire model: `wire.base.finite`.)"""
    tasks = [{"q": "lone \ud800 surrogate"}, {"n": 2 ** 80, "x": [1e308, -0.0, 1e-300]},
             {"deep": {"a": [None, True, "café 😀"]}}, {}]
    b = await queue.enqueue(RolloutRequest(tasks=tasks, env="math"))
    claims = await queue.claim_many("w", 10)
    got = {c.group_index: (await store.work(c.trajectory_id, c)).task for c in claims}
    assert [got[g] for g in range(len(tasks))] == tasks and len(claims) == len(tasks)
    assert (await store.work(f"{b.id}-0-0")).task == tasks[0]  # read from Redis, without a claim


async def test_a_batchs_parameters_are_read_once_however_many_of_it_start_at_once(queue, store, monkeypatch):
    """A worker with thousands of free slots claims hundreds of one batch at once: one read of
    its parameters between them (not one each, which ran its connection pool dry)."""
    b = await queue.enqueue(request(50, 4))
    claims = await queue.claim_many("w", 200)
    reads = []
    real = store.r.hget

    async def counted(*args):
        reads.append(args)
        return await real(*args)

    monkeypatch.setattr(store.r, "hget", counted)
    works = await asyncio.gather(*(store.work(c.trajectory_id, c) for c in claims))
    assert len(reads) == 1 and {w.batch_id for w in works} == {b.id} and len(works) == 200
    assert sorted((w.group_index, w.sample_index) for w in works) == [(g, s) for g in range(50) for s in range(4)]
