"""The scheduling knobs at the gateway: per-batch priority on the wire, tenant weights and the
running cap from the settings, recorded with each submission and honoured by the next claim."""

from __future__ import annotations

import dataclasses

import pytest

from rollout_service.app import create_app
from rollout_service.config import Settings
from scheduler.queue import Queue
from tests.conftest import LiveServer
from tests.rollout_service.test_auth import ADMIN, client, new_key

BATCH = {"tasks": [{"seed": 1}, {"seed": 2}], "env": "math", "group_size": 2}


def test_tenant_weights_parse_and_a_malformed_setting_fails_at_start(settings):
    s = dataclasses.replace(settings, tenant_weights=" team-a=3, team-b=0.5 ")
    assert (s.tenant_weight("team-a"), s.tenant_weight("team-b"), s.tenant_weight("other")) == (3.0, 0.5, 1.0)
    for bad in ("team-a", "team-a=0", "=2", "team-a=x"):
        with pytest.raises(ValueError):
            create_app(dataclasses.replace(settings, tenant_weights=bad))


def test_the_settings_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("ROLLOUT_TENANT_WEIGHTS", "a=2")
    monkeypatch.setenv("ROLLOUT_MAX_RUNNING_PER_TENANT", "7")
    monkeypatch.setenv("ROLLOUT_LONGEST_FIRST", "1")
    s = Settings.from_env()
    assert (s.tenant_weight("a"), s.max_running_per_tenant, s.longest_first) == (2.0, 7, True)


@pytest.mark.parametrize("priority", [101, -101, "high", 1.5])
def test_a_priority_out_of_range_is_a_422(settings, priority):
    with LiveServer(create_app(settings)) as srv, client(srv) as c:
        r = c.post("/v1/batches", json={**BATCH, "priority": priority})
        assert r.status_code == 422 and set(r.json()["error"]) == {"code", "message", "details"}


async def test_weights_cap_and_priority_reach_the_claim_order(settings, redis, keys):
    s = dataclasses.replace(settings, admin_key=ADMIN, tenant_weights="team-a=3", max_running_per_tenant=5)
    with LiveServer(create_app(s)) as srv:
        a, b = new_key(srv, "team-a"), new_key(srv, "team-b")
        with client(srv, a) as ca, client(srv, b) as cb:
            low = ca.post("/v1/batches", json={**BATCH, "tasks": [{"seed": i} for i in range(10)]}).json()["id"]
            high = ca.post("/v1/batches", json={**BATCH, "priority": 9}).json()["id"]
            other = cb.post("/v1/batches", json={**BATCH, "tasks": [{"seed": i} for i in range(10)]}).json()["id"]
    assert await redis.hget(keys.tenant_share("team-a"), "weight") == b"3.0"
    q = Queue(redis, keys)
    got = [c.trajectory_id.split("-")[0] for c in await q.claim_many("w", 12)]
    # by group (2 members); team-a weighs 3, so it goes again while its running/3 is below
    # team-b's running; within team-a its high-priority batch first; each tenant stops at 5
    assert got == [high, high, other, other, high, high, low, other, other, other]
    assert await q.claim("w") is None  # both at their running cap: the rest wait queued
    assert await q.depth() == 24 + 20 - 10
