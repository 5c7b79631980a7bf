"""The gateway expires finished batches on its own: with a tiny retention, a finished batch is
gone (404) after a sweep, while a batch still queued is kept."""

from __future__ import annotations

import dataclasses
import time

import httpx

from rollout_service.app import create_app
from tests.conftest import LiveServer, RunningWorker

BATCH = {"tasks": [{"question": "2+2?", "answer": 4}], "env": "math", "group_size": 2}


def test_a_finished_batch_expires_and_a_queued_one_stays(settings):
    s = dataclasses.replace(settings, result_retention_s=0.05, retention_sweep_s=0.05)
    with LiveServer(create_app(s)) as gw, httpx.Client(base_url=gw.url) as c:
        with RunningWorker(s):
            done = c.post("/v1/batches", json=BATCH).json()["id"]
            deadline = time.monotonic() + 60
            while c.get(f"/v1/batches/{done}").json().get("state") not in ("completed", None):
                assert time.monotonic() < deadline, "the batch never finished"
                time.sleep(0.05)
        waiting = c.post("/v1/batches", json=BATCH).json()["id"]  # no worker now: it stays queued
        deadline = time.monotonic() + 60
        while c.get(f"/v1/batches/{done}").status_code != 404:
            assert time.monotonic() < deadline, "the finished batch was never expired"
            time.sleep(0.05)
        assert c.get(f"/v1/trajectories/{done}-0-0").status_code == 404
        assert c.get(f"/v1/batches/{waiting}").json()["state"] == "queued"
        assert [b["id"] for b in c.get("/v1/batches").json()] == [waiting]
