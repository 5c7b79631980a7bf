"""Typed resource pools, with real bwrap sandboxes: one property per test."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

import pytest

from env_workers.resources import (
    IllegalTransition,
    Pools,
    PoolSize,
    Resource,
    ResourceExhausted,
    ResourceFailed,
    ResourceKind,
    ResourceState,
    Scope,
)
from env_workers.sandbox import Limits, bwrap
from env_workers.sandbox.pool import SandboxSpec

SPEC = SandboxSpec(Limits(timeout_s=5.0))
OTHER = SandboxSpec(Limits(timeout_s=5.0, memory_mb=512))
SHARED = SandboxSpec(Limits(timeout_s=5.0), scope=Scope.global_)


@pytest.fixture(autouse=True)
def _bwrap():
    if why := bwrap.available():
        pytest.fail(why)


@pytest.fixture
def pools():
    p = Pools(PoolSize(warm=0, cap=4, wait_s=5.0))
    yield p
    p.close()


def test_same_trajectory_gets_the_same_sandbox_every_turn(pools):
    a = pools.acquire("t1", SPEC)
    a.tools.call("bash", command="echo kept > f")
    b = pools.acquire("t1", SPEC)
    assert b is a and b.tools.call("bash", command="cat f").text == "kept\n"


def test_two_specs_in_one_trajectory_get_two_sandboxes(pools):
    a, b = pools.acquire("t1", SPEC), pools.acquire("t1", OTHER)
    assert a.sandbox.id != b.sandbox.id and len(pools.held("t1")) == 2


def test_two_trajectories_get_two_sandboxes(pools):
    assert pools.acquire("t1", SPEC).sandbox.id != pools.acquire("t2", SPEC).sandbox.id


def test_nothing_is_made_until_a_tool_is_called(pools):
    claims = pools.claims("quiet")
    assert claims.held == [] and pools.stats() == {}
    claims.release()  # releasing nothing is fine


def test_prewarmed_pool_hands_out_a_ready_sandbox():
    pool = Pools(PoolSize(warm=2, cap=4))
    try:
        pool.prewarm(SPEC)
        _wait(lambda: pool.pool(SPEC).stats()["idle"] == 2)
        t0 = time.monotonic()
        box = pool.acquire("t1", SPEC)
        r = box.tools.call("bash", command="echo hi")  # bash already runs: no start to pay
        assert r.text == "hi\n" and time.monotonic() - t0 < 1.0
        _wait(lambda: pool.pool(SPEC).stats()["idle"] == 2)  # refilled in the background
    finally:
        pool.close()


def test_wait_at_the_cap_is_bounded(pools):
    small = Pools(PoolSize(warm=0, cap=1, wait_s=0.3))
    try:
        small.acquire("t1", SPEC)
        t0 = time.monotonic()
        with pytest.raises(ResourceExhausted, match="in use"):
            small.acquire("t2", SPEC)
        assert 0.25 < time.monotonic() - t0 < 10.0  # waited its 0.3 s, then gave up (generous: a loaded machine)
    finally:
        small.close()


def test_a_waiter_gets_the_resource_freed_by_another(pools):
    small = Pools(PoolSize(warm=0, cap=1, wait_s=5.0), sizes={})
    try:
        small.acquire("t1", SHARED)
        got = {}
        th = threading.Thread(target=lambda: got.setdefault("box", small.acquire("t2", SHARED)))
        th.start()
        time.sleep(0.2)
        small.release("t1")
        th.join(5)
        assert "box" in got
    finally:
        small.close()


def test_trajectory_scope_is_destroyed_at_release(pools):
    box = pools.acquire("t1", SPEC)
    (r,) = pools.held("t1")
    pools.release("t1")
    assert r.state is ResourceState.destroyed and not box.sandbox.workspace.exists()
    assert pools.pool(SPEC).stats()["live"] == 0


def test_global_scope_is_reset_and_reused(pools):
    box = pools.acquire("t1", SHARED)
    box.tools.call("bash", command="echo secret > f; (sleep 300 &)")
    _wait(lambda: _pids(box.sandbox.uid, b"sleep\x00300"), 5.0)  # the detached sleep may take a moment to exec
    pools.release("t1")
    again = pools.acquire("t2", SHARED)
    assert again.sandbox.id == box.sandbox.id  # the same sandbox, reused
    assert again.tools.call("bash", command="ls -A | wc -l").text == "0\n"
    _wait(lambda: not _pids(box.sandbox.uid, b"sleep\x00300"), 5.0)


def test_illegal_transitions_raise():
    r = Resource(SPEC, value=None)
    with pytest.raises(IllegalTransition):
        r.to(ResourceState.reset)  # warm -> reset skips acquired
    r.to(ResourceState.acquired, "t1")
    r.to(ResourceState.destroyed)
    with pytest.raises(IllegalTransition):
        r.to(ResourceState.warm)  # destroyed is final


@dataclass(frozen=True)
class Broken:
    kind: ResourceKind = ResourceKind.sandbox
    scope: Scope = Scope.trajectory

    def create(self):
        raise OSError("no space left")

    def reset(self, value): ...

    def destroy(self, value): ...


def test_a_failed_create_is_an_error_and_frees_its_slot(pools):
    with pytest.raises(ResourceFailed, match="no space left"):
        pools.acquire("t1", Broken())
    assert pools.pool(Broken()).stats()["live"] == 0


@dataclass(frozen=True)
class ApiSlot:
    """An external API with a concurrency limit: the resource is a slot, reset is free."""

    name: str
    kind: ResourceKind = ResourceKind.api
    scope: Scope = Scope.global_
    made: list = field(default_factory=list, compare=False, hash=False)

    def create(self):
        self.made.append(1)
        return f"{self.name}-slot-{len(self.made)}"

    def reset(self, value): ...

    def destroy(self, value): ...


def test_api_slots_are_capped_per_kind_and_reused():
    api = ApiSlot("search")
    p = Pools(PoolSize(warm=0, cap=8), sizes={ResourceKind.api: PoolSize(warm=0, cap=2, wait_s=0.1)})
    try:
        assert p.acquire("t1", api) != p.acquire("t2", api)
        with pytest.raises(ResourceExhausted):
            p.acquire("t3", api)
        p.release("t1")
        p.acquire("t3", api)
        assert len(api.made) == 2  # the released slot was reused, not remade
    finally:
        p.close()


def test_close_destroys_held_and_idle_sandboxes():
    p = Pools(PoolSize(warm=1, cap=4))
    box = p.acquire("t1", SPEC)
    _wait(lambda: p.pool(SPEC).stats()["idle"] == 1)
    p.close()
    assert not box.sandbox.workspace.exists()
    with pytest.raises(ResourceFailed):
        p.acquire("t2", SPEC)


def _pids(uid: int, cmdline: bytes) -> list[int]:
    """Host pids of live processes of `uid` whose command line starts with `cmdline`."""
    found = []
    for e in os.scandir("/proc"):
        try:
            if e.name.isdigit() and e.stat().st_uid == uid and \
                    open(f"/proc/{e.name}/cmdline", "rb").read().startswith(cmdline):
                found.append(int(e.name))
        except OSError:
            pass
    return found


def _wait(cond, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)
