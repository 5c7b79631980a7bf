"""One way to connect to Redis, for every process (gateway, rollout and env workers, allocator).

    r = connect("redis://127.0.0.1:6379/0")
    r = connect("redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster/0")   # follows failovers

Failover: a `redis+sentinel://` URL names Sentinels and the primary's service name; every new
connection asks them where the primary is now, and a connection to a demoted primary
(READONLY) is dropped as a connection error, so the retry below lands on the new primary.
Sentinel, not Redis Cluster: every script in `scheduler.queue` touches keys of many
trajectories, batches and tenants at once, which Cluster allows only inside one hash slot (one
node), so it would buy no scale here and cost every key a hash tag.

What a failover can lose: replication is asynchronous, so writes the old primary acknowledged
but had not yet sent on are gone. `durable()` closes that for the one write nothing else would
redo — a submitted batch (the gateway WAITs for a replica before answering 202). Every other
write is redone by the lease protocol when lost: a lost claim or heartbeat lets the lease lapse
and the trajectory runs again; a lost result leaves the trajectory running under a lease that
lapses, so it runs again and its result is written once (the stream event with it: an SSE
reader that had already seen the lost event sees the trajectory again, from its new run).

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
from dataclasses import dataclass
from urllib.parse import unquote

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger(__name__)

# Connection refused, reset, timed out, or "LOADING" (BusyLoadingError is a ConnectionError).
UNAVAILABLE: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError)
# Anything Redis raised: UNAVAILABLE, or an error reply in the middle of a failover (READONLY,
# NOREPLICAS, MASTERDOWN, a script cache the new primary has not loaded yet). Whatever it is,
# it is the service's trouble, never a trajectory's: a worker restarts the episode uncharged.
REDIS_FAULT: tuple[type[Exception], ...] = (redis.exceptions.RedisError,)

# About 3 s of retries in all (0.05, 0.1, 0.2, 0.4, 0.8, 1.0 s + jitter): longer than an
# embedded Redis takes to restart from its append-only file, short enough for an HTTP caller.
RETRIES = 6


SENTINEL_SCHEMES = ("redis+sentinel", "sentinel")


@dataclass(frozen=True, slots=True)
class SentinelURL:
    """`redis+sentinel://[:password@]host:port[,host:port...]/service[/db]`."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    password: str | None = None

    @classmethod
    def parse(cls, url: str) -> SentinelURL | None:
        scheme, sep, rest = url.partition("://")
        if not sep or scheme not in SENTINEL_SCHEMES:
            return None
        auth, _, rest = rest.rpartition("@")
        hosts, _, path = rest.partition("/")
        parts = [p for p in path.split("/") if p]
        if not hosts or not parts or len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
            raise ValueError(f"a Sentinel URL is redis+sentinel://host:port[,host:port]/service[/db], not {url!r}")
        sentinels = []
        for h in hosts.split(","):
            host, _, port = h.rpartition(":")
            sentinels.append((host or h, int(port) if host else 26379))
        password = unquote(auth.partition(":")[2] or auth) if auth else None
        return cls(tuple(sentinels), parts[0], int(parts[1]) if len(parts) == 2 else 0, password)


def _defaults(kwargs: dict) -> dict:
    kwargs.setdefault("socket_connect_timeout", 2.0)
    kwargs.setdefault("socket_timeout", 10.0)
    kwargs.setdefault("health_check_interval", 15)  # PING a connection idle that long before use
    return kwargs


def connect(url: str, **kwargs) -> aioredis.Redis:
    kwargs.setdefault("retry", Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), RETRIES))
    _defaults(kwargs)
    if (sen := SentinelURL.parse(url)) is None:
        return aioredis.from_url(url, **kwargs)
    from redis.asyncio.sentinel import Sentinel

    probe = {"socket_connect_timeout": kwargs["socket_connect_timeout"], "socket_timeout": 2.0}
    return Sentinel(sen.sentinels, sentinel_kwargs=probe).master_for(
        sen.service, db=sen.db, password=sen.password, **kwargs)


def connect_sync(url: str, **kwargs) -> redis.Redis:
    """The same, for the few synchronous callers (the `rollout up` supervisor)."""
    _defaults(kwargs)
    if (sen := SentinelURL.parse(url)) is None:
        return redis.Redis.from_url(url, **kwargs)
    from redis.sentinel import Sentinel

    probe = {"socket_connect_timeout": kwargs["socket_connect_timeout"], "socket_timeout": 2.0}
    return Sentinel(sen.sentinels, sentinel_kwargs=probe).master_for(
        sen.service, db=sen.db, password=sen.password, **kwargs)


def replicated(url: str) -> int:
    """Replicas a write should reach before it is acknowledged, by default: 1 behind Sentinel."""
    return 1 if SentinelURL.parse(url) else 0


async def durable(r: aioredis.Redis, script, args: list, replicas: int, timeout_ms: int = 1000):
    """Run a registered script, then WAIT (on the same connection) until `replicas` replicas
    have it, for at most `timeout_ms`. Fewer acknowledgements are logged, not raised: the
    write is on the primary, and refusing it would turn a slow replica into an outage."""
    if replicas <= 0:
        return await script(args=args)
    pipe = r.pipeline(transaction=False)
    await script(args=args, client=pipe)
    pipe.wait(replicas, timeout_ms)
    got, acked = await pipe.execute()
    if acked < replicas:
        log.warning("write reached %d of %d replicas within %d ms", acked, replicas, timeout_ms)
    return got


def cancel_point() -> None:
    """Raise CancelledError if this task was cancelled and the cancel got lost on the way.

    Python 3.11's `asyncio.wait_for`, which redis-py wraps around sending every command, returns
    the inner result instead of raising when a cancel lands as the send completes; the task
    still counts the cancel (`cancelling()`), nothing else reacts to it. A loop of Redis calls
    that is stopped by cancelling it (a worker's shutdown) calls this once a turn, or it goes
    on claiming and heartbeating after its shutdown."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


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


class Coalesced:
    """Calls made in the same moment (the same turn of the event loop) go to Redis as one.

        finishes = Coalesced(lambda items: script(args=[prefix, *flatten(items)]))  # a reply per item
        got = await finishes.submit(item)

    The first item of a moment schedules a send for the next turn of the loop; every item
    submitted until then rides along (at most `most` to a call, so one call stays short). A
    failed send fails each of its items, and each caller retries on its own. An item whose
    caller was cancelled after submitting is still sent: like a command already on the wire.

    `prepare`, if given, finishes a call's items in place just before they are sent, all at
    once (`await prepare(items)`: an exception or None per item; an item that failed is failed
    alone and left out of the call). Work done per item at submission time interleaves with
    whatever else the loop runs; done here, it runs back to back, its code and data still hot."""

    def __init__(self, send, most: int = 256, prepare=None):
        self._send, self.most, self._prepare = send, most, prepare
        self._pending: list[tuple[list, asyncio.Future]] = []
        self._sending: set[asyncio.Task] = set()  # referenced until done

    async def submit(self, item: list):
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((item, fut))
        if len(self._pending) == 1:
            self._schedule()
        return await fut

    def _schedule(self) -> None:
        task = asyncio.create_task(self._flush())
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _flush(self) -> None:
        batch, self._pending = self._pending[:self.most], self._pending[self.most:]
        if self._pending:  # more than one call's worth: the rest goes out beside this one
            self._schedule()
        try:
            if self._prepare is not None:
                errors = await self._prepare([item for item, _ in batch])
                if any(e is not None for e in errors):
                    for (_, fut), e in zip(batch, errors):
                        if e is not None and not fut.done():
                            fut.set_exception(e)
                    batch = [b for b, e in zip(batch, errors) if e is None]
                    if not batch:
                        return
            got = await self._send([item for item, _ in batch])
            if len(got) != len(batch):
                raise redis.exceptions.ResponseError(f"{len(got)} replies to {len(batch)} items")
        except Exception as e:
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
            return
        except BaseException:  # cancelled (the loop is closing): so are its callers
            for _, fut in batch:
                fut.cancel()
            raise
        for (_, fut), one in zip(batch, got):
            if not fut.done():
                fut.set_result(one)
