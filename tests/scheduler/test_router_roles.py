"""Role-aware routing: prefill to prefill engines, decode to decode engines, mixed stays put."""

from __future__ import annotations

import random

import pytest

from scheduler.roles import Role
from scheduler.router import NoEngine, RoleAware, StickyLeastLoaded

P, D, M = Role.prefill, Role.decode, Role.mixed


def test_prefill_and_decode_go_to_their_roles_and_stick():
    r = RoleAware({"p0": P, "p1": P, "d0": D, "d1": D})
    loads = {"p0": 5, "p1": 1, "d0": 0, "d1": 9}
    assert r.pick_prefill("t", loads) == "p1"
    assert r.pick_decode("t", loads, "p1") == "d0"
    loads = {"p0": 0, "p1": 100, "d0": 100, "d1": 0}
    assert r.pick_prefill("t", loads) == "p1" and r.pick_decode("t", loads, "p1") == "d0"  # sticky
    assert r.pick("u", loads) == "p0"  # RoutingPolicy.pick is the prefill
    r.forget("t")
    assert r.pick_prefill("t", loads) == "p0" and r.pick_decode("t", loads, "p0") == "d1"


def test_mixed_keeps_the_decode_local_and_role_changes_reroute():
    r = RoleAware({"m0": M, "d0": D})
    loads = {"m0": 10, "d0": 0}
    assert r.pick_prefill("t", loads) == "m0"  # the only engine that prefills
    assert r.pick_decode("t", loads, "m0") == "m0"  # no transfer
    r.set_roles({"m0": D, "d0": P})  # roles swap (after a drain)
    assert r.pick_prefill("t", loads) == "d0" and r.pick_decode("t", loads, "d0") == "m0"


def test_engines_without_a_role_get_nothing():
    r = RoleAware({"p0": P, "d0": D})  # "x" is draining: not in the roles
    loads = {"p0": 100, "d0": 100, "x": 0}
    assert r.pick_prefill("t", loads) == "p0" and r.pick_decode("t", loads, "p0") == "d0"
    with pytest.raises(NoEngine):
        RoleAware({"d0": D}).pick_prefill("t", {"d0": 0})
    with pytest.raises(NoEngine):
        RoleAware({"p0": P}).pick_decode("t", {"p0": 0}, "p0")


def test_all_mixed_routes_like_sticky_least_loaded():
    ids = [f"e{i}" for i in range(5)]
    r, s = RoleAware({e: M for e in ids}), StickyLeastLoaded()
    rng = random.Random(3)
    for _ in range(2000):
        tid = f"t{rng.randint(0, 60)}"
        loads = {e: rng.randint(0, 50) for e in ids}
        if rng.random() < 0.1:
            r.forget(tid), s.forget(tid)
        assert r.pick(tid, loads) == s.pick(tid, loads)


def test_stickiness_yields_to_a_much_less_loaded_engine():
    r = RoleAware({"a": Role.mixed, "b": Role.mixed}, slack_tokens=1000)
    assert r.pick_prefill("t", {"a": 0, "b": 10}) == "a"
    assert r.pick_prefill("t", {"a": 1500, "b": 600}) == "a"  # within 2x + slack: keep the cached prefix
    assert r.pick_prefill("t", {"a": 50_000, "b": 600}) == "b"  # far busier: move, once
    assert r.pick_prefill("t", {"a": 0, "b": 900}) == "b"
