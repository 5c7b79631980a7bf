"""A Redis restart with persistence on loses no accepted batch (kill -9, then restart)."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
import redis.asyncio as aioredis

from rollout_service.up import redis_server_binary
from scheduler.keys import Keys
from scheduler.queue import Queue
from scheduler.store import Store
from tests.conftest import free_port
from wire import RolloutRequest, TrajectoryState


def start_redis(port: int, data) -> subprocess.Popen:
    binary = shutil.which("redis-server") or redis_server_binary()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
                             "--appendonly", "yes", "--appendfsync", "always", "--save", ""],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    return proc


async def wait_ping(r, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await r.ping()
        except (ConnectionError, OSError, aioredis.ConnectionError):
            assert time.monotonic() < deadline
            time.sleep(0.1)


@pytest.mark.timeout(60)
async def test_accepted_batch_survives_redis_kill9(tmp_path):
    port = free_port()
    proc = start_redis(port, tmp_path)
    try:
        r = aioredis.from_url(f"redis://127.0.0.1:{port}/0")
        await wait_ping(r)
        q = Queue(r, Keys("rs:"))
        b = await q.enqueue(RolloutRequest(tasks=[{"seed": i} for i in range(50)], env="math", group_size=4))
        claim = await q.claim("w")  # one running, 199 queued at the moment of the crash
        await r.aclose()
        proc.kill()
        proc.wait()
        proc = start_redis(port, tmp_path)
        r = aioredis.from_url(f"redis://127.0.0.1:{port}/0")
        await wait_ping(r)
        st = await Store(r, Keys("rs:")).batch_status(b.id)
        assert st is not None and st.num_trajectories == 200
        assert st.counts[TrajectoryState.queued] == 199 and st.counts[TrajectoryState.running] == 1
        assert await Queue(r, Keys("rs:")).depth() == 199
        assert (await Queue(r, Keys("rs:")).heartbeat(claim)) is True  # the lease survived too
        await r.aclose()
    finally:
        proc.kill()
        proc.wait()
