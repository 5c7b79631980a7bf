"""Who is out there: engines and env workers, registered in Redis.

Engines are registered by an operator (API/CLI) and stay until removed. Env workers
register themselves and heartbeat a short-TTL key (`announce_worker`, the env worker's
`Registrar` interface); one without a live key is ignored. This module is the one place that
knows how engines and workers are stored, and `engines()`/`engine(id)` the one way to read an
engine's kind, role, state (ready | draining) and policy version: everyone else keeps at most
a cache of them.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time

import redis.asyncio as aioredis
from redis.exceptions import WatchError

from scheduler.capacity import Capacity
from scheduler.connection import UNAVAILABLE
from scheduler.forecast import Demand
from scheduler.keys import Keys
from scheduler.timing import TurnTiming
from wire import EngineInfo, LoadedWeights, WorkerInfo


class UnknownEnv(ValueError):
    """No env worker has ever offered this environment: the request names no real env."""


class Registry:
    unavailable = UNAVAILABLE  # what a caller riding out a Redis outage retries on

    def __init__(self, redis: aioredis.Redis, keys: Keys | None = None):
        self.r = redis
        self.k = keys or Keys()

    async def add_engine(self, info: EngineInfo) -> None:
        await self.r.hset(self.k.engines, info.id, info.model_dump_json())

    async def remove_engine(self, engine_id: str) -> bool:
        return bool(await self.r.hdel(self.k.engines, engine_id))

    async def engine(self, engine_id: str) -> EngineInfo | None:
        raw = await self.r.hget(self.k.engines, engine_id)
        return EngineInfo.model_validate_json(raw) if raw else None

    async def _update(self, engine_id: str, **fields) -> EngineInfo:
        """Change some fields of one engine, atomically: the allocator's role changes, workers'
        capability reports and weight updates write the same record, and a plain read-then-write
        could put back what another writer just changed."""
        async with self.r.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(self.k.engines)
                    raw = await pipe.hget(self.k.engines, engine_id)
                    if not raw:
                        raise KeyError(engine_id)
                    info = EngineInfo.model_validate_json(raw).model_copy(update=fields)
                    pipe.multi()
                    pipe.hset(self.k.engines, engine_id, info.model_dump_json())
                    await pipe.execute()
                    return info
                except WatchError:
                    continue  # another engine's record changed meanwhile: read again

    async def set_policy_version(self, engine_id: str, version: int, model: str | None = None,
                                 weights: LoadedWeights | None = None) -> None:
        """The engine serves `version` from now on: `weights` loaded (`rollout_service.weights`)."""
        await self._update(engine_id, policy_version=version, **({"model": model} if model else {}),
                           **({"weights": weights} if weights else {}))

    async def set_role(self, engine_id: str, role: str) -> EngineInfo:
        """Serve `role` from now on (ready)."""
        return await self._update(engine_id, role=role, state="ready", next_role=None)

    async def set_capabilities(self, engine_id: str, can_serve: list[str] | None, kv: str,
                               read_back: bool = False) -> EngineInfo:
        """What the engine's KV connector allows (`can_serve`, None: could not tell), in words why,
        and whether it keeps a decoded turn's KV for the next prefill to read (`read_back`)."""
        return await self._update(engine_id, can_serve=can_serve, kv=kv, kv_read_back=read_back)

    async def drain(self, engine_id: str, next_role: str | None = None) -> EngineInfo:
        """No new work: the engine finishes what it holds, then takes `next_role` (`set_role`)."""
        return await self._update(engine_id, state="draining", next_role=next_role)

    async def engines(self) -> list[EngineInfo]:
        return sorted((EngineInfo.model_validate_json(v) for v in (await self.r.hgetall(self.k.engines)).values()),
                      key=lambda e: e.id)

    async def report(self, worker_id: str, loads: dict[str, int], down: set[str], ttl_s: int = 10) -> None:
        """A worker's view of the engines: its in-flight tokens on each, and which look down.
        Each entry carries its time: one from a worker that died is ignored after `ttl_s` even
        while other workers keep the key alive (it would hold a draining engine forever)."""
        now = int(time.time())
        pipe = self.r.pipeline(transaction=False)
        for eid, tokens in loads.items():
            pipe.hset(self.k.engine_load(eid), worker_id, f"{tokens}@{now}")
            pipe.expire(self.k.engine_load(eid), ttl_s)
        for eid in down:
            pipe.set(self.k.engine_down(eid), worker_id, ex=ttl_s)
        await pipe.execute()

    async def report_timing(self, t: TurnTiming, keep: int = 10_000) -> None:
        """One turn as an engine served it, for the allocator to measure speed from (the newest
        `keep` are kept: an allocator that is not running costs a bounded list)."""
        pipe = self.r.pipeline(transaction=False)
        pipe.lpush(self.k.turn_timings, t.dumps())
        pipe.ltrim(self.k.turn_timings, 0, keep - 1)
        await pipe.execute()

    async def take_timings(self, most: int = 10_000) -> list[TurnTiming]:
        """The turns reported since the last call (oldest first), removed as they are read."""
        pipe = self.r.pipeline(transaction=True)
        pipe.lrange(self.k.turn_timings, 0, most - 1)
        pipe.ltrim(self.k.turn_timings, most, -1)
        raw, _ = await pipe.execute()
        out = []
        for v in reversed(raw):
            try:
                out.append(TurnTiming.loads(v))
            except ValueError:
                continue  # not ours to fail on: one malformed entry is skipped
        return out

    async def save_profile(self, model: str, size: int, capacity: Capacity) -> None:
        """The step model measured on engines of `size` GPUs serving `model` (the newest replaces it)."""
        await self.r.hset(self.k.launch_profiles(model), str(size), json.dumps(capacity.profile()))

    async def profiles(self, model: str) -> dict[int, Capacity]:
        """Every engine size a step model was measured at for `model`."""
        raw = await self.r.hgetall(self.k.launch_profiles(model))
        return {int(k): Capacity.from_profile(json.loads(v)) for k, v in raw.items()}

    async def record_phase(self, demand: Demand, at: float | None = None, keep: int = 720) -> None:
        """One allocation decision's demand (the newest `keep` are kept: an hour at 5 s a decision)."""
        pipe = self.r.pipeline(transaction=False)
        pipe.lpush(self.k.launch_phase, json.dumps({"at": time.time() if at is None else at,
                                                    "demand": dataclasses.asdict(demand)}))
        pipe.ltrim(self.k.launch_phase, 0, keep - 1)
        await pipe.execute()

    async def phase(self, since: float = 0.0) -> list[Demand]:
        """The recorded decisions' demands from `since` (unix time) on, oldest first."""
        fields = {f.name for f in dataclasses.fields(Demand)}
        out = []
        for raw in reversed(await self.r.lrange(self.k.launch_phase, 0, -1)):
            rec = json.loads(raw)
            if rec["at"] >= since:
                out.append(Demand(**{k: v for k, v in rec["demand"].items() if k in fields}))
        return out

    async def report_phases(self, worker_id: str, values: dict[str, int], ttl_s: int = 10) -> None:
        """A worker's live trajectories by phase and its demand forecast (summed by readers)."""
        key = self.k.worker_phases(worker_id)
        pipe = self.r.pipeline(transaction=False)
        pipe.delete(key)
        pipe.hset(key, mapping=values)
        pipe.expire(key, ttl_s)
        await pipe.execute()

    async def phases(self) -> dict[str, int]:
        """Live trajectories by phase and forecast demand, over every reporting worker."""
        return await self._sum(self.k.worker_phases("*"))

    async def pools(self) -> dict[str, int]:
        """Resource pool use ({kind}:{state} -> n), over every env worker."""
        return await self._sum(self.k.worker_pools("*"))

    async def _sum(self, pattern: str) -> dict[str, int]:
        out: dict[str, int] = {}
        async for key in self.r.scan_iter(match=pattern, count=1000):
            for k, v in (await self.r.hgetall(key)).items():
                k = k.decode() if isinstance(k, bytes) else k
                out[k] = out.get(k, 0) + int(v)
        return out

    async def engine_loads(self, engine_ids: list[str], ttl_s: int = 10) -> dict[str, tuple[int, bool]]:
        """engine id -> (in-flight tokens summed over workers reporting within `ttl_s`, up?)"""
        pipe = self.r.pipeline(transaction=False)
        for eid in engine_ids:
            pipe.hvals(self.k.engine_load(eid))
            pipe.exists(self.k.engine_down(eid))
        got = await pipe.execute()
        oldest = time.time() - ttl_s

        def fresh(raw: bytes | str) -> int:
            tokens, _, at = (raw.decode() if isinstance(raw, bytes) else raw).partition("@")
            return int(tokens) if not at or int(at) >= oldest else 0

        return {eid: (sum(fresh(v) for v in got[2 * i]), not got[2 * i + 1]) for i, eid in enumerate(engine_ids)}

    async def announce_worker(self, info: WorkerInfo, pools: dict[str, int], ttl_s: int = 10) -> None:
        """An env worker's heartbeat: its registration (rewritten every beat, so a flushed Redis
        has it back within one), a live key and its pool use ({kind}:{state} -> n), for `ttl_s`."""
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(self.k.workers, info.id, info.model_dump_json())
        pipe.set(self.k.worker_alive(info.id), "1", ex=ttl_s)
        pipe.delete(self.k.worker_pools(info.id))
        if pools:
            pipe.hset(self.k.worker_pools(info.id), mapping=pools)
        pipe.expire(self.k.worker_pools(info.id), ttl_s)
        await pipe.execute()

    async def withdraw_worker(self, worker_id: str) -> None:
        await self.r.hdel(self.k.workers, worker_id)
        await self.r.delete(self.k.worker_alive(worker_id))

    async def workers(self, live: bool = True) -> list[WorkerInfo]:
        """Env workers that heartbeat (`live=False`: every one ever registered, dead or alive)."""
        infos = [WorkerInfo.model_validate_json(v) for v in (await self.r.hgetall(self.k.workers)).values()]
        if not infos or not live:
            return sorted(infos, key=lambda w: w.id)
        alive = await self.r.mget([self.k.worker_alive(w.id) for w in infos])
        return sorted((w for w, a in zip(infos, alive) if a), key=lambda w: w.id)

    async def unhosted(self, env: str) -> list[str] | None:
        """Every env the registered env workers announce, when none of them hosts `env` (the
        trajectories would all end `rejected` at their first pick); None when one does, or when
        no env worker is registered at all (they may still be starting: nothing to judge by)."""
        infos = await self.workers(live=False)
        if not infos or any(_hosts(w, env) for w in infos):
            return None
        return sorted({e for w in infos for e in w.envs})

    async def pick_worker(self, env: str) -> str:
        """Base URL of a live env worker that hosts `env` (random: spreads sessions).
        LookupError while its workers are down, or while no env worker is registered at all;
        UnknownEnv (a ValueError) if none of the registered ones ever hosted it.
        A worker announcing `FAMILY:*` hosts every `FAMILY:NAME` (it answers for an unknown NAME itself)."""
        able = [w for w in await self.workers() if _hosts(w, env)]
        if not able:
            everyone = await self.workers(live=False)
            if not everyone:  # none registered yet (starting beside us): transient, as the gateway judges
                raise LookupError(f"no env worker registered yet (for {env!r})")
            if not any(_hosts(w, env) for w in everyone):
                raise UnknownEnv(f"no env worker hosts an environment named {env!r}")
            raise LookupError(f"no live env worker hosts {env!r}")
        return random.choice(able).url


def _hosts(w: WorkerInfo, env: str) -> bool:
    family, colon, _ = env.partition(":")
    return env in w.envs or (bool(colon) and f"{family}:*" in w.envs)
