"""Role-aware routing: prefill to prefill engines, decode to decode engines, mixed stays put.
Roles come with every call (the registry is their one source)."""

from __future__ import annotations

import random

import pytest

from scheduler.roles import Role
from scheduler.router import POLICIES, NoEngine, RoleAware, StickyLeastLoaded, make_policy

P, D, M = Role.prefill, Role.decode, Role.mixed


def test_prefill_and_decode_go_to_their_roles_and_stick():
    r, roles = RoleAware(), {"p0": P, "p1": P, "d0": D, "d1": D}
    loads = {"p0": 5, "p1": 1, "d0": 0, "d1": 9}
    assert r.pick_prefill("t", loads, roles) == "p1"
    assert r.pick_decode("t", loads, "p1", roles) == "d0"
    loads = {"p0": 0, "p1": 100, "d0": 100, "d1": 0}
    assert r.route("t", loads, roles) == ("p1", "d0")  # sticky
    assert r.route("u", loads, roles) == ("p0", "d1")
    r.forget("t")
    assert r.route("t", loads, roles) == ("p0", "d1")


def test_mixed_keeps_the_decode_local_and_role_changes_reroute():
    r = RoleAware()
    loads = {"m0": 10, "d0": 0}
    assert r.route("t", loads, {"m0": M, "d0": D}) == ("m0", "m0")  # the only engine that prefills; no transfer
    assert r.route("t", loads, {"m0": D, "d0": P}) == ("d0", "m0")  # roles swap (after a drain)


def test_engines_without_a_role_get_nothing():
    r = RoleAware()
    loads = {"p0": 100, "d0": 100, "x": 0}
    assert r.route("t", loads, {"p0": P, "d0": D}) == ("p0", "d0")  # "x" is draining: not in the roles
    with pytest.raises(NoEngine):
        RoleAware().pick_prefill("t", {"d0": 0}, {"d0": D})
    with pytest.raises(NoEngine):
        RoleAware().pick_decode("t", {"p0": 0}, "p0", {"p0": P})


def test_all_mixed_routes_like_sticky_least_loaded():
    ids = [f"e{i}" for i in range(5)]
    r, s, roles = RoleAware(), StickyLeastLoaded(), {e: M for e in ids}
    rng = random.Random(3)
    for _ in range(2000):
        tid = f"t{rng.randint(0, 60)}"
        loads = {e: rng.randint(0, 50) for e in ids}
        if rng.random() < 0.1:
            r.forget(tid), s.forget(tid)
        assert r.route(tid, loads, roles) == s.route(tid, loads, roles)


def test_policies_are_chosen_by_name():
    assert isinstance(make_policy("role_aware"), RoleAware) and isinstance(make_policy("sticky"), StickyLeastLoaded)
    assert set(POLICIES) == {"role_aware", "sticky"}
    with pytest.raises(ValueError, match="known: role_aware, sticky"):
        make_policy("nope")


def test_stickiness_yields_to_a_much_less_loaded_engine():
    r, roles = RoleAware(slack_tokens=1000), {"a": Role.mixed, "b": Role.mixed}
    assert r.pick_prefill("t", {"a": 0, "b": 10}, roles) == "a"
    assert r.pick_prefill("t", {"a": 1500, "b": 600}, roles) == "a"  # within 2x + slack: keep the cached prefix
    assert r.pick_prefill("t", {"a": 50_000, "b": 600}, roles) == "b"  # far busier: move, once
    assert r.pick_prefill("t", {"a": 0, "b": 900}, roles) == "b"


def test_decode_stickiness_yields_to_a_much_less_loaded_decode_engine():
    """Trajectories that first decoded while one decode engine was left (the others draining toward
    prefill, then back) stayed on it for their whole life: in the simulator one TP1 engine held 319
    sequences while 23 others held none, for 7,000 s (the 32B, 1P@tp8+24D@tp1, `reason`)."""
    r, roles = RoleAware(slack_tokens=1000), {"p0": P, "d0": D, "d1": D}
    assert r.pick_decode("t", {"p0": 0, "d0": 0, "d1": 10}, "p0", roles) == "d0"
    assert r.pick_decode("t", {"p0": 0, "d0": 1500, "d1": 600}, "p0", roles) == "d0"  # within 2x + slack: stay
    assert r.pick_decode("t", {"p0": 0, "d0": 50_000, "d1": 600}, "p0", roles) == "d1"  # far busier: move, once
    assert r.pick_decode("t", {"p0": 0, "d0": 0, "d1": 900}, "p0", roles) == "d1"
    off = RoleAware(rebalance=0)
    assert off.pick_decode("t", {"d0": 0, "d1": 10}, "p0", roles) == "d0"
    assert off.pick_decode("t", {"d0": 50_000, "d1": 0}, "p0", roles) == "d0"  # rebalancing off: sticky


def test_a_crowded_mixed_engine_sends_a_decode_elsewhere():
    """A prefill engine became mixed with a burst of prompts queued: decoding them all where they were
    prefilled would leave the other engines idle (MoE doc async: guided 0.87x colocated; 32B TP2 coding
    at 32 GPUs: 0.82x). Past the rule that makes prefill stickiness yield, the decode moves, KV with it."""
    r, roles = RoleAware(slack_tokens=1000), {"m0": M, "m1": M, "d0": D}
    assert r.pick_decode("t", {"m0": 1500, "m1": 600, "d0": 700}, "m0", roles) == "m0"  # within 2x + slack
    assert r.pick_decode("t", {"m0": 50_000, "m1": 600, "d0": 700}, "m0", roles) == "d0"  # a decode engine first
    assert r.pick_decode("u", {"m0": 50_000, "m1": 600}, "m0", {"m0": M, "m1": M}) == "m1"  # else a mixed one
    assert RoleAware(rebalance=0).pick_decode("t", {"m0": 50_000, "d0": 0}, "m0", roles) == "m0"  # rebalancing off
