"""Input bounds on a live gateway against a real Redis: trajectories per batch (tasks × group
size), bytes per task, bytes per request (declared or streamed) and open trajectories per tenant."""

from __future__ import annotations

import contextlib
import dataclasses
import json

import httpx

from rollout_service.app import create_app
from rollout_service.config import Settings
from tests.conftest import LiveServer, RunningWorker

BATCH = {"tasks": [{"seed": 1}, {"seed": 2}], "env": "math", "group_size": 3}  # 6 trajectories


@contextlib.contextmanager
def gateway_with(settings: Settings, **limits):
    with LiveServer(create_app(dataclasses.replace(settings, **limits))) as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as c:
        yield c


def error(r: httpx.Response, status: int, code: str) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) == {"code", "message", "details"} and err["code"] == code and err["message"]
    return err


def test_limits_come_from_the_environment(monkeypatch):
    for name, value in (("MAX_REQUEST_BYTES", "1000"), ("MAX_TRAJECTORIES_PER_BATCH", "12"),
                        ("MAX_TASK_BYTES", "300"), ("MAX_OPEN_PER_TENANT", "40")):
        monkeypatch.setenv(f"ROLLOUT_{name}", value)
    s = Settings.from_env()
    assert (s.max_request_bytes, s.max_trajectories_per_batch, s.max_task_bytes, s.max_open_per_tenant) == \
        (1000, 12, 300, 40)


async def test_the_batch_cap_counts_tasks_times_group_size(settings, redis, keys):
    """The reported case: 1,000 tasks × 256 was accepted as 256,000 trajectories."""
    with gateway_with(settings) as c:
        r = c.post("/v1/batches", json={"tasks": [{"seed": i} for i in range(1000)], "env": "math",
                                        "group_size": 256})
        err = error(r, 422, "too_many_trajectories")
        assert err["details"] == {"trajectories": 256_000, "limit": settings.max_trajectories_per_batch}
    assert await redis.get(keys.queued) is None


async def test_the_cap_holds_at_its_edge_and_queues_nothing_past_it(settings, redis, keys):
    with gateway_with(settings, max_trajectories_per_batch=12) as c:
        assert c.post("/v1/batches", json={**BATCH, "tasks": [{"seed": i} for i in range(4)]}).status_code == 202
        for body in ({**BATCH, "tasks": [{"seed": i} for i in range(5)]},      # 5 × 3 = 15
                     {**BATCH, "tasks": [{"seed": i} for i in range(13)], "group_size": 1}):
            err = error(c.post("/v1/batches", json=body), 422, "too_many_trajectories")
            assert err["details"]["limit"] == 12
        assert len(c.get("/v1/batches").json()) == 1
    assert int(await redis.get(keys.queued)) == 12  # only the batch at the limit


def test_a_task_over_its_size_limit_is_422_naming_it(settings):
    with gateway_with(settings, max_task_bytes=256) as c:
        at_limit = {"text": "x" * (256 - len(json.dumps({"text": ""})))}
        assert len(json.dumps(at_limit)) == 256
        assert c.post("/v1/batches", json={**BATCH, "tasks": [{"seed": 1}, at_limit]}).status_code == 202
        over = {"text": "x" * 300}
        err = error(c.post("/v1/batches", json={**BATCH, "tasks": [{"seed": 1}, at_limit, over]}),
                    422, "task_too_large")
        assert err["details"] == {"task_index": 2, "bytes": len(json.dumps(over)), "limit": 256}
        assert "task 2" in err["message"]


def test_a_body_over_the_limit_is_413_declared_or_streamed(settings):
    limit = 4096
    with gateway_with(settings, max_request_bytes=limit) as c:
        declared = c.post("/v1/batches", content=b"x" * (limit + 1), headers={"content-type": "application/json"})
        error(declared, 413, "too_large")

        def chunks(body: bytes, size: int = 1000):  # a generator: httpx sends it chunked, no Content-Length
            for i in range(0, len(body), size):
                yield body[i:i + size]

        big = json.dumps(BATCH).encode() + b" " * limit
        r = c.post("/v1/batches", content=chunks(big), headers={"content-type": "application/json"})
        assert "content-length" not in r.request.headers
        error(r, 413, "too_large")
        small = json.dumps(BATCH).encode() + b" " * 1000  # under the limit, streamed the same way
        assert c.post("/v1/batches", content=chunks(small), headers={"content-type": "application/json"}).status_code == 202


def test_a_full_tenant_gets_429_with_retry_after_and_its_batches_back(settings):
    with gateway_with(settings, max_open_per_tenant=10) as c:
        first = c.post("/v1/batches", json={**BATCH, "idempotency_key": "step-1"}).json()
        r = c.post("/v1/batches", json=BATCH)
        err = error(r, 429, "tenant_quota")
        assert int(r.headers["retry-after"]) > 0
        assert err["details"] == {"open": 6, "requested": 6, "limit": 10}
        again = c.post("/v1/batches", json={**BATCH, "idempotency_key": "step-1"})  # a resubmission still works
        assert again.status_code == 202 and again.json()["id"] == first["id"] and not again.json()["created"]
        fits = {**BATCH, "tasks": [{"seed": 1}, {"seed": 2}], "group_size": 2}  # 6 + 4 = 10, the limit
        assert c.post("/v1/batches", json=fits).status_code == 202
        error(c.post("/v1/batches", json={**BATCH, "tasks": [{"seed": 1}], "group_size": 1}), 429, "tenant_quota")
        c.delete(f"/v1/batches/{first['id']}")  # cancelled trajectories are no longer open
        assert c.post("/v1/batches", json=BATCH).status_code == 202
        assert len(c.get("/v1/batches").json()) == 3  # the refused ones left nothing behind


def test_a_batch_bigger_than_the_quota_is_422_not_429(settings):
    with gateway_with(settings, max_open_per_tenant=5) as c:
        err = error(c.post("/v1/batches", json=BATCH), 422, "too_many_trajectories")  # waiting would not help
        assert err["details"] == {"trajectories": 6, "limit": 5}


def test_the_quota_is_per_tenant(settings):
    admin = "admin-secret-key"
    with gateway_with(settings, max_open_per_tenant=10, admin_key=admin) as c:
        keys = {t: c.post("/v1/keys", json={"tenant": t}, headers={"Authorization": f"Bearer {admin}"}).json()["key"]
                for t in ("team-a", "team-b")}
        as_ = {t: {"Authorization": f"Bearer {k}"} for t, k in keys.items()}
        assert c.post("/v1/batches", json=BATCH, headers=as_["team-a"]).status_code == 202
        error(c.post("/v1/batches", json=BATCH, headers=as_["team-a"]), 429, "tenant_quota")
        assert c.post("/v1/batches", json=BATCH, headers=as_["team-b"]).status_code == 202


def test_finished_trajectories_free_the_quota(settings):
    with gateway_with(settings, max_open_per_tenant=10) as c, RunningWorker(settings):
        bid = c.post("/v1/batches", json=BATCH).json()["id"]
        with c.stream("GET", f"/v1/batches/{bid}/events") as r:
            events = [line for line in r.iter_lines() if line.startswith("event:")]
        assert events[-1] == "event: done"
        assert c.post("/v1/batches", json={**BATCH, "tasks": [{"seed": i} for i in range(5)], "group_size": 2}
                      ).status_code == 202  # 10: the whole quota again


def test_the_limits_are_in_the_openapi(settings):
    with gateway_with(settings) as c:
        responses = c.get("/openapi.json").json()["paths"]["/v1/batches"]["post"]["responses"]
    assert {"413", "422", "429"} <= set(responses) and "Retry-After" in responses["429"]["headers"]
