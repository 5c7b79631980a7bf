"""The prefill/decode allocator live, beside two real vLLM CPU engines with a KV connector:
a rollout worker runs batches of multi-turn episodes (long observations first, then many short
turns) while the allocation loop reads its forecasts and the engines' loads, until the allocator
has drained the colocated engines into a prefill and a decode role; a batch then runs split.
Every trajectory keeps all its turns, and its tokens equal a colocated re-run of the same
episode (temperature 0).

Not asserted: *which* batch brings the switch. With two engines the allocator's estimate for
these demands sits close to the line between colocated and split (a run moved during the long
observations: the forecast of decode work was still the prior's for turns not yet seen), so
the phase is printed, not pinned.

The allocator decides with a given `Capacity`: an engine whose steps pay 20 ms more whenever
they carry a prefill (the stall a data-parallel attention group shows), not this machine's
speed: both engines share two CPU cores here, where no split can pay, and the measured fit
(`PDController(measure=True)`, as `rollout allocator` runs) would only say so. What this test
shows is the live loop (detection, forecast, drain, switch, routing, KV hand-over, no turn
lost), not a speed-up; speed-up claims live in `benchmarks/pd_allocation.py`.
"""

from __future__ import annotations

import asyncio
import hashlib
import time

import pytest

from env_workers.client import LocalEnvs
from env_workers.env import StepResult
from env_workers.registry import EnvSpec, register
from rollout_service.engines.fleet import Fleet
from rollout_service.rollout import run_episode
from rollout_service.worker import Worker
from scheduler.allocator import AllocatorConfig, Capacity
from scheduler.launch import Launch, candidates, plan
from scheduler.pd_control import PDController
from scheduler.queue import Queue
from scheduler.registry import Registry
from scheduler.store import Store
from wire import EngineInfo, Message, RolloutRequest

# generous: on a loaded 2-core machine the tiny model decoded ~1 token/s (2026-12-04)
pytestmark = [pytest.mark.integration, pytest.mark.timeout(5400)]

ENV = "pd_observations"
WORDS = ("the a of to in and is it that for on with as was at by be this are from or have not but what all were "
         "when we there can your which their said if do will each about how up out them then she many some so "
         "these would other into has more her two like him see time could no make than first been its who now "
         "people my made over did down only way find use may water long little very after words called just "
         "where most know user system hello yes answer question think step number tool call result").split()
TURNS = 3
SHORT, LONG = 3, 1000  # words per observation (the tiny model's tokenizer: a token or two a word)


def words(n: int, *key: object) -> str:
    h = hashlib.sha256(repr(key).encode()).digest()
    return " ".join(WORDS[(h[i % 32] + 7 * i) % len(WORDS)] for i in range(n))


class Observations:
    """Deterministic episodes of `turns` turns whose observations have `words` words each, after
    a tool that takes `tool_s` (time for the worker to report and the allocator to act; the
    content never depends on it)."""

    def reset(self, task: dict, seed: int | None = None):
        self.task, self.turn = task, 0
        return [Message(role="system", content="Repeat what the tool says."),
                Message(role="user", content=words(task["words"], task["id"]))], {}

    def step(self, action: str) -> StepResult:
        time.sleep(self.task["tool_s"])
        self.turn += 1
        if self.turn >= self.task["turns"]:
            return StepResult([], 0.0, True, False)
        return StepResult([Message(role="user", content=words(self.task["words"], self.task["id"], self.turn))],
                          0.0, False, False)

    def close(self) -> None:
        pass


@pytest.fixture(scope="module", autouse=True)
def observations_env():
    try:
        register(EnvSpec(ENV, Observations, "observations of a set length (prefill/decode allocation test)"))
    except ValueError:
        pass  # registered by an earlier run in this process


def batch(n: int, obs_words: int, tag: str) -> RolloutRequest:
    tasks = [{"id": f"{tag}-{i}", "words": obs_words, "turns": TURNS, "tool_s": 0.3} for i in range(n)]
    return RolloutRequest(tasks=tasks, env=ENV, max_turns=TURNS, sampling={"temperature": 0.0, "max_tokens": 4})


async def wait_for(check, timeout_s: float, what: str, every_s: float = 0.25):
    """Wait on a condition (generously: the machine is shared and slow), never on a clock margin."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = await check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what} after {timeout_s:.0f} s")
        await asyncio.sleep(every_s)


async def test_allocator_switches_roles_when_the_workload_shifts_and_loses_no_turn(two_kv_engines, redis, keys):
    reg, store = Registry(redis, keys), Store(redis, keys)
    queue = Queue(redis, keys, lease_s=60.0)
    for i, url in enumerate(two_kv_engines.urls):
        await reg.add_engine(EngineInfo(id=f"e{i}", url=url, model="tiny", tokenizer=two_kv_engines.tokenizer))
    worker = Worker(queue, store, Fleet(registry=reg), LocalEnvs(), concurrency=8, registry=reg)
    # min_observed: no move before the forecasters have learned from a response per live
    # trajectory (their first guesses are prior); dwell_s (the default 30 s) also keeps a just-
    # built allocator from moving anything in its first 30 s
    stall = Capacity(prefill_tok_s=20_000, step=[0.010, 1e-4, 4e-8, 5e-5, 0.020])  # a prefill-carrying step: +20 ms
    ctl = PDController(reg, stall, AllocatorConfig(dwell_s=30.0, min_observed=1.0), horizon_s=10.0)
    stop = asyncio.Event()
    roles_seen: list[dict[str, str]] = []
    demand: list[dict[str, int]] = []  # what the workers reported, for a failure's message

    async def allocate() -> None:
        while not stop.is_set():
            if not split():  # once split, the layout is left as it is: the test checks the split turns
                await ctl.step()
                roles_seen.append({e.id: e.role for e in await reg.engines()})
                demand.append(await reg.phases())
            await asyncio.sleep(0.5)

    def split() -> bool:
        return any(set(r.values()) == {"prefill", "decode"} for r in roles_seen)

    tasks = [asyncio.create_task(worker.run(stop)), asyncio.create_task(allocate())]
    batches: list[str] = []

    async def finished(bid: str) -> bool:
        st = await store.batch_status(bid)
        return st is not None and st.done == st.num_trajectories

    try:
        await wait_for(lambda: _all_detected(reg), 120, "the worker to detect what the engines can serve")
        # long observations, then many short turns, batch after batch until the allocator has
        # split the engines (the first batches run while its first dwell passes)
        k = 0
        while not split():
            assert k < 12, f"no switch after {k} batches: {demand[-5:]}"
            kind = LONG if k < 2 else SHORT
            batches.append((await queue.enqueue(batch(8, kind, f"{'long' if kind == LONG else 'short'}{k}"))).id)
            await wait_for(lambda: finished(batches[-1]), 1800, f"batch {k}")
            k += 1
        switched = [(m.engine, m.old.value, m.new.value) for _, m in ctl.allocator.history]
        final = {e.id: e.role for e in await reg.engines()}

        async def worker_follows() -> bool:
            await worker.fleet.refresh()
            return {e: r.value for e, r in worker.fleet.roles.items()} == final

        await wait_for(worker_follows, 60, "the worker to follow the new roles")
        # and one batch after the switch: its turns run split (decode on the decode engine)
        batches.append((await queue.enqueue(batch(8, SHORT, "after"))).id)
        await wait_for(lambda: finished(batches[-1]), 1800, "the batch after the switch")
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await worker.fleet.aclose()
    first = ctl.allocator.history[0][0] if ctl.allocator.history else None
    print(f"moves: {switched}; batches run before the split: {k} ({'long' if k <= 2 else 'short'} "
          f"observations when it came); first move at allocator time {first}")
    roles = {e.id: e.role for e in await reg.engines()}
    decoder = next(e for e, r in roles.items() if r == "decode")
    # what launch planning reads (`rollout launch-plan`): every decision's demand while work ran, as
    # the workers forecast it; no step model, as this allocator decides on a given one (not measured)
    phase = await reg.phase()
    assert phase and all(d.live > 0 or d.prefill_tokens > 0 for d in phase) and max(d.live for d in phase) >= 1
    assert len(phase) <= len(roles_seen) and await reg.profiles("tiny") == {}

    # no turn lost: every trajectory completed with all its turns, recorded in order
    trajs = []
    for bid in batches:
        items, _ = await store.trajectories(bid, 0, 100)
        assert len(items) == 8
        for t in items:
            assert t.state.value == "completed" and t.failure is None, (t.id, t.state, t.failure)
            assert [turn.index for turn in t.turns] == list(range(TURNS)), t.id
            trajs.append(t)
    after = [t for t in trajs if t.batch_id == batches[-1]]
    assert all(turn.engine_id == decoder for t in after for turn in t.turns)

    # tokens unchanged: each episode again, colocated (both engines mixed, no allocator)
    for eid in roles:
        await reg.set_role(eid, "mixed")
    fleet = Fleet(registry=reg, refresh_s=0)
    works = [await store.work(t.id) for t in trajs]
    room = asyncio.Semaphore(8)

    async def rerun(work):
        async with room:
            return await run_episode(work, fleet, LocalEnvs())

    try:
        again = await asyncio.gather(*(rerun(w) for w in works))
    finally:
        await fleet.aclose()
    for t, ref in zip(trajs, again):
        assert ref.failure is None and t.token_ids == ref.token_ids, t.id

    # launch planning's live path, measured: an allocator that measures takes the turns the workers
    # reported (vLLM's own timings), saves the step model under the engines' size (1 GPU each), and
    # the planner ranks the launches of their 2 GPUs on the recorded demand
    measuring = PDController(reg, measure=True, horizon_s=10.0)
    await measuring.step()
    saved = await reg.profiles("tiny")
    assert list(saved) == [1] and saved[1].samples > 0
    ranked = plan(candidates(2, saved), await reg.phase(), saved)
    assert {c for c, _ in ranked} == {Launch(1, 0, 2), Launch(1, 1, prefill=1)}
    assert all(0 < sec < float("inf") for _, sec in ranked)


async def _all_detected(reg: Registry) -> bool:
    return all(e.can_serve is not None for e in await reg.engines())
