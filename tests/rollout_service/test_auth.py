"""API keys, tenants and admin rights on a live gateway."""

from __future__ import annotations

import dataclasses

import httpx
import pytest
import redis as syncredis

from rollout_service.app import create_app
from tests.conftest import REDIS_URL, LiveServer

ADMIN = "admin-secret-key"
BATCH = {"tasks": [{"seed": 1}], "env": "math", "group_size": 2}


@pytest.fixture
def secured(settings):
    with LiveServer(create_app(dataclasses.replace(settings, admin_key=ADMIN))) as srv:
        yield srv


def client(srv, key=None) -> httpx.Client:
    return httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {key}"} if key else {})


def new_key(srv, tenant, admin=False) -> str:
    with client(srv, ADMIN) as c:
        r = c.post("/v1/keys", json={"tenant": tenant, "admin": admin})
        assert r.status_code == 201
        return r.json()["key"]


def test_missing_or_wrong_key_is_401(secured):
    with client(secured) as c:
        r = c.post("/v1/batches", json=BATCH)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    with client(secured, "nope") as c:
        assert c.get("/v1/batches").status_code == 401


def test_a_tenant_never_sees_another_tenants_batches(secured):
    a, b = new_key(secured, "team-a"), new_key(secured, "team-b")
    with client(secured, a) as ca, client(secured, b) as cb:
        bid = ca.post("/v1/batches", json=BATCH).json()["id"]
        assert ca.get(f"/v1/batches/{bid}").json()["tenant"] == "team-a"
        for r in (cb.get(f"/v1/batches/{bid}"), cb.get(f"/v1/batches/{bid}/trajectories"),
                  cb.get(f"/v1/batches/{bid}/events"), cb.delete(f"/v1/batches/{bid}"),
                  cb.get(f"/v1/trajectories/{bid}-0-0")):
            assert r.status_code == 404, r.request.url  # 404, not 403: existence does not leak
        assert cb.get("/v1/batches").json() == []
        assert [x["id"] for x in ca.get("/v1/batches").json()] == [bid]
        assert ca.get(f"/v1/batches/{bid}").json()["state"] == "queued"  # b's cancel did nothing
        # idempotency keys are per tenant: the same key in another tenant is another batch
        ka = ca.post("/v1/batches", json={**BATCH, "idempotency_key": "k"}).json()["id"]
        kb = cb.post("/v1/batches", json={**BATCH, "idempotency_key": "k"}).json()["id"]
        assert ka != kb


def test_only_admins_manage_the_fleet_and_keys(secured):
    user = new_key(secured, "team-a")
    with client(secured, user) as c:
        for r in (c.get("/v1/engines"), c.post("/v1/engines", json={"id": "e", "url": "http://x"}),
                  c.post("/v1/keys", json={"tenant": "x"}), c.post("/v1/weights", json={"path": "/p"}),
                  c.get("/v1/workers")):
            assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
    with client(secured, ADMIN) as c:
        assert c.get("/v1/engines").status_code == 200


def test_keys_are_stored_hashed(secured, prefix):
    key = new_key(secured, "team-a")
    r = syncredis.Redis.from_url(REDIS_URL)
    stored = [k.decode() for k in r.scan_iter(match=f"{prefix}apikey:*")]
    assert len(stored) == 2 and not any(key in k or ADMIN in k for k in stored)
    assert all(key.encode() not in (r.get(k) or b"") for k in stored)
