"""The gateway over real HTTP against a real Redis."""

from __future__ import annotations

import asyncio
import os
import time

import httpx
import pytest

from rollout_service.cli import main as cli_main
from scheduler.registry import Registry
from tests.conftest import RunningWorker
from wire import WorkerInfo

BATCH = {"tasks": [{"seed": 1}, {"seed": 2}], "env": "math", "group_size": 3}


def test_submit_returns_at_once_and_status_counts(gateway):
    with httpx.Client(base_url=gateway.url) as c:
        r = c.post("/v1/batches", json=BATCH)
        assert r.status_code == 202
        body = r.json()
        assert body["num_trajectories"] == 6 and body["created"] is True
        st = c.get(f"/v1/batches/{body['id']}").json()
        assert st["state"] == "queued" and st["counts"]["queued"] == 6  # no worker yet: nothing ran


def test_idempotency_key_never_duplicates(gateway):
    with httpx.Client(base_url=gateway.url) as c:
        ids = {c.post("/v1/batches", json={**BATCH, "idempotency_key": "k1"}).json()["id"] for _ in range(3)}
        assert len(ids) == 1
        assert len(c.get("/v1/batches").json()) == 1
        # The key reused for another request (a fixed key per training step, run again with other
        # tasks) answered 202 with the first batch: the trainer read trajectories of other tasks.
        (bid,) = ids
        for other in ({**BATCH, "tasks": [{"seed": 7}]}, {**BATCH, "group_size": 2}, {**BATCH, "env": "calc"}):
            r = c.post("/v1/batches", json={**other, "idempotency_key": "k1"})
            assert r.status_code == 409, r.text
            err = r.json()["error"]
            assert err["code"] == "idempotency_conflict" and bid in err["message"]
            assert err["details"] == {"idempotency_key": "k1", "batch_id": bid}
        assert c.post("/v1/batches", json={**BATCH, "idempotency_key": "k1"}).json() == {
            "id": bid, "num_trajectories": 6, "created": False}
        assert len(c.get("/v1/batches").json()) == 1


def test_results_pages_and_events(gateway, settings):
    with httpx.Client(base_url=gateway.url) as c, RunningWorker(settings):
        bid = c.post("/v1/batches", json=BATCH).json()["id"]
        events, ids = [], []
        with c.stream("GET", f"/v1/batches/{bid}/events", timeout=30) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            for line in r.iter_lines():
                if line.startswith("event:"):
                    events.append(line.split(":", 1)[1].strip())
                elif line.startswith("id:"):
                    ids.append(line.split(":", 1)[1].strip())
        assert events.count("trajectory") == 6 and events[-1] == "done"
        # Resumed at `done` (a client that lost the connection as `done` came, an EventSource
        # reconnecting by itself): `done` again, where the stream sent keepalives for ever.
        for resume in (ids[-1], ids[-2]):
            with c.stream("GET", f"/v1/batches/{bid}/events", headers={"Last-Event-ID": resume}, timeout=30) as r:
                lines = [line for line in r.iter_lines() if line.startswith(("event:", "id:"))]
            assert lines == [f"id: {ids[-1]}", "event: done"], (resume, lines)
        st = c.get(f"/v1/batches/{bid}").json()
        assert st["state"] == "completed" and st["counts"]["completed"] == 6
        page1 = c.get(f"/v1/batches/{bid}/trajectories", params={"limit": 4}).json()
        page2 = c.get(f"/v1/batches/{bid}/trajectories", params={"cursor": page1["next_cursor"], "limit": 4}).json()
        ids = [t["id"] for t in page1["items"] + page2["items"]]
        assert len(set(ids)) == 6 and page2["next_cursor"] is None
        one = c.get(f"/v1/trajectories/{ids[0]}").json()
        assert one["turns"][0]["output_ids"] and one["reward"] in (0.0, 1.0)
        assert one["training_samples"] is None  # the flat view only when asked: it doubles the tokens sent
        # Raw HTTP users get the training view, aligned, without our SDK.
        flat = c.get(f"/v1/trajectories/{ids[0]}", params={"samples": "true"}).json()["training_samples"]
        turns = one["turns"]
        assert len(flat) == 1 and flat[0]["token_ids"] == [i for t in turns for i in t["prompt_ids"] + t["output_ids"]]
        assert len(flat[0]["token_ids"]) == len(flat[0]["loss_mask"]) == len(flat[0]["logprobs"])
        assert sum(flat[0]["loss_mask"]) == sum(len(t["output_ids"]) for t in turns)
        page = c.get(f"/v1/batches/{bid}/trajectories", params={"samples": "true"}).json()["items"]
        assert all(t["training_samples"][0]["token_ids"] for t in page)
        schema = c.get("/openapi.json").json()["components"]["schemas"]["Trajectory"]["properties"]
        assert "loss_mask" in schema["training_samples"]["description"]


def test_cancel_stops_the_batch(gateway):
    with httpx.Client(base_url=gateway.url) as c:
        bid = c.post("/v1/batches", json=BATCH).json()["id"]
        st = c.delete(f"/v1/batches/{bid}").json()
        assert st["state"] == "cancelled" and st["counts"]["cancelled"] == 6
        t = c.get(f"/v1/trajectories/{bid}-0-0").json()
        assert t["state"] == "cancelled" and t["failure"]["kind"] == "cancelled"


def test_bad_input_is_4xx_with_one_error_shape(gateway):
    with httpx.Client(base_url=gateway.url) as c:
        cases = [
            c.post("/v1/batches", json={"tasks": [], "env": "math"}),
            c.post("/v1/batches", json={**BATCH, "group_size": 0}),
            c.post("/v1/batches", json={**BATCH, "sampling": {"temperature": -1}}),
            c.post("/v1/batches", json={**BATCH, "sampling": {"stop": ["</s>", ""]}}),  # vLLM refuses "": 3 x 3 tries
            c.post("/v1/batches", json={**BATCH, "surprise": 1}),
            c.post("/v1/batches", content=b"{not json", headers={"content-type": "application/json"}),
            c.get("/v1/batches/nope"),
            c.get("/v1/trajectories/nope"),
            c.delete("/v1/batches/nope"),
            c.get("/v1/batches/nope/events"),
            c.get("/v1/nowhere"),
            # a port past 65535 matched the URL pattern and made the next weight push a 500
            c.post("/v1/engines", json={"id": "e9", "url": "http://127.0.0.1:99999"}),
            c.post("/v1/engines", json={"id": "e9", "url": "http://127.0.0.1:0/v1"}),
        ]
        bid = c.post("/v1/batches", json=BATCH).json()["id"]
        cases += [  # out-of-range input on a batch that exists (a cursor past int64 once reached Redis: 500)
            c.get(f"/v1/batches/{bid}/trajectories", params={"cursor": 66514192454484418560}),
            c.get(f"/v1/batches/{bid}/events", params={"after": "not-an-id"}),
            c.get(f"/v1/batches/{bid}/events", headers={"Last-Event-ID": "1-2-3"}),
        ]
        for r in cases:
            assert 400 <= r.status_code < 500, (r.request.url, r.status_code)
            err = r.json()["error"]
            assert set(err) == {"code", "message", "details"} and err["message"]


async def test_a_batch_for_an_env_no_worker_hosts_is_a_422_naming_the_nearest(gateway, redis, keys):
    """A typo in `env` was a 202, then every trajectory ended `rejected` at its first env call.
    With env workers registered, the gateway knows what they host and refuses it at once."""
    reg = Registry(redis, keys)
    async with httpx.AsyncClient(base_url=gateway.url) as c:
        # no env worker registered yet (they may still be starting): nothing to judge by, queued
        assert (await c.post("/v1/batches", json={**BATCH, "env": "maht"})).status_code == 202
        # (a worker that does not answer: a family's name is judged by the episodes, as before)
        await reg.announce_worker(WorkerInfo(id="env-a", url="http://127.0.0.1:9", envs=["math", "calc",
                                                                                     "reasoning_gym:*"]), {}, 10)
        await reg.announce_worker(WorkerInfo(id="env-b", url="http://b", envs=["swe"]), {}, 1)
        await redis.delete(keys.worker_alive("env-b"))  # dead but registered: what it hosted still counts
        for env, hint in [("maht", "did you mean 'math'?"), ("gymnasium:CartPole-v1", "")]:
            r = await c.post("/v1/batches", json={**BATCH, "env": env})
            assert r.status_code == 422, (env, r.text)
            err = r.json()["error"]
            assert err["code"] == "unknown_env" and hint in err["message"], err
            assert err["details"] == {"env": env, "hosted": ["calc", "math", "reasoning_gym:*", "swe"]}
        for env in ("math", "swe", "reasoning_gym:leg_counting"):  # a family worker answers for its names
            assert (await c.post("/v1/batches", json={**BATCH, "env": env})).status_code == 202, env
        assert len((await c.get("/v1/batches")).json()) == 4  # nothing of the refused ones was queued


async def test_a_family_name_its_env_workers_cannot_run_is_a_422_with_their_reason(gateway, redis, keys):
    """Env workers announce a third-party family as `FAMILY:*`, so `reasoning_gym:leg_countng` was
    a 202 and every trajectory ended `rejected` when its episode opened it. The gateway now asks a
    live env worker hosting the family, which resolves the name as a session would."""
    from env_workers import registry as envs
    from env_workers.server import create_app as env_app
    from tests.conftest import LiveServer

    with LiveServer(env_app()) as worker:
        await Registry(redis, keys).announce_worker(WorkerInfo(id="env-a", url=worker.url, envs=envs.hosted()),
                                                    {}, 10)
        async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as c:
            r = await c.post("/v1/batches", json={**BATCH, "env": "reasoning_gym:leg_countng"})
            assert r.status_code == 422, r.text
            err = r.json()["error"]
            assert err["code"] == "unknown_env" and "did you mean leg_counting" in err["message"], err
            assert err["details"] == {"env": "reasoning_gym:leg_countng"}
            for env in ("reasoning_gym:leg_counting", "reasoning_gym_retry:leg_counting", "math"):
                assert (await c.post("/v1/batches", json={**BATCH, "env": env})).status_code == 202, env
            assert len((await c.get("/v1/batches")).json()) == 3


def test_a_task_with_nan_or_infinity_is_a_422_naming_where(gateway):
    """Python's JSON parser reads NaN, Infinity and 1e400, which JSON does not have: such a task
    was queued, failed every attempt as the service's own `internal` crash, and read back with
    null in its place. Now the request is refused, saying where, and nothing is queued."""
    with httpx.Client(base_url=gateway.url) as c:
        for raw, where in [(b'{"seed": NaN}', "$.seed"), (b'{"a": [1, {"b": -Infinity}]}', "$.a[1].b"),
                           (b'{"x": 1e400}', "$.x")]:
            body = b'{"env": "math", "tasks": [{"seed": 1}, ' + raw + b"]}"
            r = c.post("/v1/batches", content=body, headers={"content-type": "application/json"})
            assert r.status_code == 422, (raw, r.status_code, r.text)
            err = r.json()["error"]
            assert err["code"] == "invalid_request" and where in err["message"], err
            assert err["details"][0]["loc"] == ["body", "tasks", 1]
        # large numbers, a string that reads NaN, an integer beyond 64 bits (kept exact)
        fine = b'{"env": "math", "tasks": [{"x": 1.5, "y": [2e300, {"z": "NaN"}], "big": %d}]}' % 2**100
        r = c.post("/v1/batches", content=fine, headers={"content-type": "application/json"})
        assert r.status_code == 202
        assert len(c.get("/v1/batches").json()) == 1  # only the finite one was queued
        assert c.get(f"/v1/batches/{r.json()['id']}/request").json()["tasks"][0]["big"] == 2**100


def test_bodies_json_cannot_carry_are_422s_saying_what_and_nothing_is_queued(gateway):
    """A lone UTF-16 surrogate (an escape JSON text allows, and no UTF-8 string holds) in a
    metadata value made the submission a 500, in an idempotency key a dropped connection, and in
    a task a batch that failed every attempt and then broke every read of its results. Bodies that
    are not UTF-8, or nested deeper than the parser recurses, said only "error parsing the body"."""
    batch = b'{"env": "math", "tasks": [{"seed": 1}]'
    cases = [
        (batch + b', "metadata": {"k": "\\udfff"}}', "$.metadata.k holds a lone UTF-16 surrogate"),
        (batch + b', "idempotency_key": "a\\ud800"}', "$.idempotency_key holds a lone UTF-16 surrogate"),
        (b'{"env": "math", "tasks": [{"q": ["x", "\\uDBFF what"]}]}', "$.tasks[0].q[1] holds a lone"),
        (b'{"env": "math", "tasks": [{"\\ud800": 1}]}', "$.tasks[0] (a key) holds a lone"),
        (batch + b', "metadata": {"k": "\xed\xa0\x80"}}', "not UTF-8"),  # a surrogate as raw bytes
        (batch + b', "metadata": {"k": "\xff"}}', "not UTF-8"),
        (b'{"env": "math", "tasks": [{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}]}", "nested too deeply"),
    ]
    with httpx.Client(base_url=gateway.url) as c:
        for body, says in cases:
            r = c.post("/v1/batches", content=body, headers={"content-type": "application/json"})
            assert r.status_code == 422, (body[:80], r.status_code, r.text)
            err = r.json()["error"]
            assert err["code"] == "invalid_request" and says in err["message"], (says, err)
        sid = c.post("/v1/sessions", json={}).json()["id"]
        r = c.post(f"/v1/sessions/{sid}/chat/completions", content=b'{"messages": [{"role": "user", "content": '
                   b'"\\ud83d"}]}', headers={"content-type": "application/json"})
        assert r.status_code == 422 and "$.messages[0].content holds a lone" in r.json()["error"]["message"]
        # A surrogate pair is one character (an emoji from an ASCII-only encoder), and a byte order mark is skipped.
        r = c.post("/v1/batches", content=b'\xef\xbb\xbf{"env": "math", "tasks": [{"q": "\\ud83d\\ude00"}]}',
                   headers={"content-type": "application/json"})
        assert r.status_code == 202, r.text
        assert len(c.get("/v1/batches").json()) == 1
        assert c.get(f"/v1/batches/{r.json()['id']}/request").json()["tasks"] == [{"q": "\U0001F600"}]


def test_oversized_body_is_413(gateway, settings):
    with httpx.Client(base_url=gateway.url) as c:
        big = b"x" * (settings.max_request_bytes + 1)
        r = c.post("/v1/batches", content=big, headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"


async def test_engines_register_list_whether_up_and_deregister(gateway, redis, keys, capsys):
    """The listing says what the workers find: an engine a worker's probe finds unreachable was
    listed `ready` like any other (only /metrics told); now `up` is false there and in `rollout engines`."""
    async with httpx.AsyncClient(base_url=gateway.url) as c:
        for eid in ("e1", "e2"):
            r = await c.post("/v1/engines", json={"id": eid, "url": "http://127.0.0.1:9", "policy_version": 3})
            assert r.status_code == 201 and "up" not in r.json()
        assert (await c.post("/v1/engines", json={"id": "e3", "url": "http://127.0.0.1:9", "up": False})).status_code == 422
        await Registry(redis, keys).report("w1", {"e1": 40, "e2": 7}, down={"e2"})
        listed = {e["id"]: e for e in (await c.get("/v1/engines")).json()}
        assert {k: (e["up"], e["inflight_tokens"], e["policy_version"]) for k, e in listed.items()} == {
            "e1": (True, 40, 3), "e2": (False, 7, 3)}
        await asyncio.to_thread(cli_main, ["engines", "--url", gateway.url])
        rows = {line.split("│")[1].strip(): line for line in capsys.readouterr().out.splitlines() if "│ e" in line}
        assert " no " in rows["e2"] and " no " not in rows["e1"], rows
        assert (await c.delete("/v1/engines/e2")).status_code == 200
        assert (await c.delete("/v1/engines/e2")).status_code == 404
        assert [e["id"] for e in (await c.get("/v1/engines")).json()] == ["e1"]


def test_healthz_docs_and_metrics(gateway):
    with httpx.Client(base_url=gateway.url) as c:
        assert c.get("/healthz").json() == {"ok": True}
        assert c.get("/docs").status_code == 200
        assert "/v1/batches" in c.get("/openapi.json").json()["paths"]
        c.post("/v1/batches", json=BATCH)
        m = c.get("/metrics").text
        assert "rollout_queue_depth 6.0" in m and "rollout_batches_submitted_total 1.0" in m


def test_jobs_survive_a_gateway_restart(settings):
    from rollout_service.app import create_app
    from tests.conftest import LiveServer

    with LiveServer(create_app(settings)) as g1, httpx.Client() as c:
        bid = c.post(f"{g1.url}/v1/batches", json=BATCH).json()["id"]
    with LiveServer(create_app(settings)) as g2, httpx.Client() as c, RunningWorker(settings):
        deadline = time.monotonic() + 30
        while c.get(f"{g2.url}/v1/batches/{bid}").json()["state"] != "completed":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert c.get(f"{g2.url}/v1/batches/{bid}").json()["counts"]["completed"] == 6


def test_metrics_after_a_batch(gateway, settings):
    from wire import EngineInfo

    with httpx.Client(base_url=gateway.url) as c, RunningWorker(settings):
        c.post("/v1/engines", json=EngineInfo(id="e1", url="http://127.0.0.1:9", role="decode").model_dump())
        bid = c.post("/v1/batches", json=BATCH).json()["id"]
        with c.stream("GET", f"/v1/batches/{bid}/events", timeout=30) as r:
            for _ in r.iter_lines():
                pass
        m = c.get("/metrics").text
        turns = [t for tr in c.get(f"/v1/batches/{bid}/trajectories").json()["items"] for t in tr["turns"]]
    assert 'rollout_trajectories_finished_total{state="completed"} 6.0' in m
    # Every turn's prefill time (the simulated engine's cost model) lands in the histogram.
    got = {ln.split()[0]: float(ln.split()[1]) for ln in m.splitlines() if ln.startswith("rollout_turn_prefill")}
    h = "rollout_turn_prefill_seconds"
    assert got[f"{h}_count"] == len(turns) == got[f'{h}_bucket{{le="+Inf"}}']
    assert got[f"{h}_sum"] == pytest.approx(sum(t["timings"]["prefill_s"] for t in turns), abs=1e-4)
    assert all(t["timings"]["prefill_s"] > 0 for t in turns)
    sampled = [line for line in m.splitlines() if line.startswith('rollout_tokens_total{kind="sampled"}')]
    assert sampled and float(sampled[0].split()[-1]) > 0
    assert 'rollout_engine_up{engine="e1",role="decode"} 1.0' in m
    assert "rollout_queue_depth 0.0" in m


def test_status_cli_renders_the_metrics(gateway, settings):
    import subprocess
    import sys

    with httpx.Client(base_url=gateway.url) as c, RunningWorker(settings):
        bid = c.post("/v1/batches", json=BATCH).json()["id"]
        with c.stream("GET", f"/v1/batches/{bid}/events", timeout=30) as r:
            for _ in r.iter_lines():
                pass
    out = subprocess.run([sys.executable, "-m", "rollout_service.cli", "status", "--url", gateway.url],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "queue depth" in out.stdout and "completed: 6" in out.stdout and bid[:8] in out.stdout
    assert "no engine" not in out.stdout
    # trajectories queued and no engine registered: the workers wait for one, and status says so
    httpx.post(f"{gateway.url}/v1/batches", json=BATCH)
    out = subprocess.run([sys.executable, "-m", "rollout_service.cli", "status", "--url", gateway.url],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert "no engine registered: queued trajectories wait for one" in out.stdout, out.stdout


def test_lifecycle_phases_and_forecast_reach_metrics(gateway, settings):
    from rollout_service.engines.sim import SimEngine

    slow = {"slow": (SimEngine("slow", time_scale=30.0), "byte")}
    with httpx.Client(base_url=gateway.url) as c, RunningWorker(settings, engines=slow):
        c.post("/v1/batches", json={**BATCH, "env": "calc"})
        deadline = time.monotonic() + 20
        while True:
            m = c.get("/metrics").text
            live = [ln for ln in m.splitlines() if ln.startswith("rollout_trajectory_phase{")]
            if any(ln.endswith(" 6.0") for ln in live if 'phase="prefilling"' in ln or 'phase="tool"' in ln):
                break
            assert time.monotonic() < deadline, live
            time.sleep(0.3)
        assert 'rollout_forecast_tokens{kind="prefill_tokens"}' in m
