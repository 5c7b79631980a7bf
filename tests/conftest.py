"""Shared fixtures: a real Redis (ROLLOUT_TEST_REDIS_URL, default 127.0.0.1:6379/0) with a
fresh key prefix per test, and a live gateway served by uvicorn on a free port."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
import uuid

import httpx
import pytest
import redis as syncredis
import redis.asyncio as aioredis
import uvicorn

from rollout_service.config import Settings
from scheduler.keys import Keys

REDIS_URL = os.environ.get("ROLLOUT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

# Every HTTP client a test makes without a timeout of its own waits up to 60 s, not httpx's 5:
# the suite must pass on a loaded 2-core machine, and no test checks how fast an answer comes
# (timing claims live in benchmarks/). httpx's functions and clients all default to this one
# object; a test that is about a timeout passes its own.
for _phase in ("connect", "read", "write", "pool"):
    setattr(httpx._config.DEFAULT_TIMEOUT_CONFIG, _phase, 60.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def prefix():
    """A key prefix no other test uses; its keys are deleted afterwards."""
    p = f"rstest:{uuid.uuid4().hex[:10]}:"
    yield p
    r = syncredis.Redis.from_url(REDIS_URL)
    keys = list(r.scan_iter(match=f"{p}*", count=1000))
    if keys:
        r.delete(*keys)


@pytest.fixture
def keys(prefix) -> Keys:
    return Keys(prefix)


@pytest.fixture
async def redis():
    r = aioredis.from_url(REDIS_URL)
    yield r
    await r.aclose()


@pytest.fixture
def settings(prefix) -> Settings:
    return Settings(redis_url=REDIS_URL, key_prefix=prefix, lease_s=2.0, sse_block_ms=200)


class LiveServer:
    """Runs an ASGI app under uvicorn in a thread, on its own event loop."""

    def __init__(self, app):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="on"))
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()), daemon=True)

    def __enter__(self) -> "LiveServer":
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def gateway(settings):
    from rollout_service.app import create_app

    with LiveServer(create_app(settings)) as srv:
        yield srv


class RunningWorker:
    """A rollout worker (simulated engine, in-process envs) on its own thread and loop."""

    def __init__(self, settings: Settings, engines=None, concurrency: int = 8, discover: bool = False,
                 idle_wait_s: float = 1.0, prefetch: int | None = None):
        """`engines`: id -> (engine, tokenizer spec); `discover`: use the registry instead."""
        self.prefetch = prefetch
        self.settings, self.engines, self.concurrency, self.discover = settings, engines, concurrency, discover
        self.idle_wait_s = idle_wait_s
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop: asyncio.Event | None = None
        self.worker = None

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except asyncio.CancelledError:
            pass  # a test froze this worker on purpose (simulating its death)

    async def _main(self) -> None:
        from env_workers.client import LocalEnvs
        from rollout_service.engines.fleet import Fleet
        from rollout_service.engines.sim import SimEngine
        from rollout_service.worker import Worker
        from scheduler.queue import Queue
        from scheduler.store import Store

        s = self.settings
        r = aioredis.from_url(s.redis_url)
        keys = Keys(s.key_prefix)
        from scheduler.registry import Registry

        reg = Registry(r, keys)
        fleet = Fleet(registry=reg) if self.discover else \
            Fleet(self.engines or {"sim-0": (SimEngine("sim-0", seed=1), "byte")})
        from scheduler.results import result_store

        results = result_store(s.result_store)
        self.worker = Worker(Queue(r, keys, s.lease_s, s.max_attempts, s.max_restarts, results=results),
                             Store(r, keys, results), fleet,
                             LocalEnvs(), concurrency=self.concurrency, registry=reg,
                             idle_wait_s=self.idle_wait_s, prefetch=self.prefetch)
        self.loop, self.stop = asyncio.get_running_loop(), asyncio.Event()
        try:
            await self.worker.run(self.stop)
        finally:
            await r.aclose()

    def __enter__(self) -> "RunningWorker":
        self.thread.start()
        while self.stop is None:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(RuntimeError):  # (its loop closed already: the worker was stopped from inside)
            self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(30)  # (stopping hands back what it holds: a few round trips, longer on a loaded machine)


@pytest.fixture
def worker(settings):
    with RunningWorker(settings) as w:
        yield w
