"""Start `rollout up` for a benchmark: a free port, its own Redis key prefix, ready when an
env worker has registered. Shared by the benchmarks that measure the whole service."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid

import httpx


def start_up(redis_url: str, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    full_env = {**os.environ, "ROLLOUT_REDIS_URL": redis_url, "ROLLOUT_KEY_PREFIX": f"bench:{uuid.uuid4().hex[:8]}:",
                **(env or {})}
    proc = subprocess.Popen([sys.executable, "-m", "rollout_service.cli", "up", "--port", str(port), *args],
                            env=full_env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(f"{url}/v1/workers", timeout=1).json():
                return proc, url
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.2)
    proc.terminate()
    raise SystemExit(f"rollout up did not start (args: {args})")
