"""One way to connect to Redis, for every process (gateway, rollout and env workers, allocator).

    r = connect("redis://127.0.0.1:6379/0")

A command that meets a dropped connection (Redis restarted, failed over, or a stale socket
after an outage) is retried on a fresh connection with bounded, jittered back-off, so a
short blip costs a caller nothing. Past that budget the command raises one of
`UNAVAILABLE`; callers treat those as "Redis is away": the gateway answers 503, background
loops back off and try again, rollout workers give work back without charging it.

Non-goal: exactly-once commands. A command whose reply was lost may run twice; every
command we send is idempotent or guarded by a lease token (see `scheduler.queue`).
"""

from __future__ import annotations

import asyncio
import logging
import random

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger(__name__)

# Connection refused, reset, timed out, or "LOADING" (BusyLoadingError is a ConnectionError).
UNAVAILABLE: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError)

# About 3 s of retries in all (0.05, 0.1, 0.2, 0.4, 0.8, 1.0 s + jitter): longer than an
# embedded Redis takes to restart from its append-only file, short enough for an HTTP caller.
RETRIES = 6


def connect(url: str, **kwargs) -> aioredis.Redis:
    kwargs.setdefault("retry", Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), RETRIES))
    kwargs.setdefault("socket_connect_timeout", 2.0)
    kwargs.setdefault("socket_timeout", 10.0)
    kwargs.setdefault("health_check_interval", 15)  # PING a connection idle that long before use
    return aioredis.from_url(url, **kwargs)


def unavailable(e: BaseException) -> bool:
    return isinstance(e, UNAVAILABLE)


class Backoff:
    """Bounded, jittered exponential back-off for loops that wait for Redis to come back.

        backoff = Backoff()
        while True:
            try: ...; backoff.reset()
            except UNAVAILABLE: await backoff.wait()
    """

    def __init__(self, base_s: float = 0.1, cap_s: float = 2.0):
        self.base_s, self.cap_s = base_s, cap_s
        self.failures = 0

    def reset(self) -> None:
        self.failures = 0

    def next_s(self) -> float:
        self.failures += 1
        return min(self.cap_s, self.base_s * 2 ** min(self.failures - 1, 16)) * random.uniform(0.5, 1.0)

    async def wait(self) -> None:
        await asyncio.sleep(self.next_s())
