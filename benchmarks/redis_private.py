"""A Redis of the benchmark's own on a free loopback port, no persistence: its memory figures
are ours alone (the shared Redis holds other work), and nothing is left behind.

    with PrivateRedis() as url:      # redis://127.0.0.1:PORT/0
        ...
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time

import redis

from rollout_service.up import redis_server_binary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivateRedis:
    def __enter__(self) -> str:
        port = free_port()
        binary = shutil.which("redis-server") or redis_server_binary()
        self.proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"redis://127.0.0.1:{port}/0"
        for _ in range(200):
            try:
                redis.Redis.from_url(url).ping()
                return url
            except redis.ConnectionError:
                time.sleep(0.05)
        self.proc.kill()
        raise RuntimeError("the private redis-server did not start")

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(10)
