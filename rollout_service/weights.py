"""Weight updates: one call moves every engine to a new policy version, and keeps it there.

For each engine, concurrently, its kind's `update_weights` (for vLLM: pause, load, clear the
prefix cache, resume), recording the new version in the registry while its requests are
still frozen. Frozen requests finish on the new weights, and the worker labels a turn with
the version serving when it finished.

An engine that fails any step is still resumed, and reported; its version is not bumped.

An engine that restarts (it crashed; its supervisor or Kubernetes brought it back) comes back
with the weights it was launched with, while the registry still names the version pushed
before: every turn it served would carry that version, sampled by other weights. So the
registry keeps what each update loaded and the engine process's start time then
(`EngineInfo.weights`); the fleet runs no turn on an engine whose process started later
(`Fleet.probe`), and `WeightKeeper`, in every gateway, loads the same weights into it again
under the same version (one gateway at a time per engine: a lock in Redis).

Non-goals: distributing the checkpoint (engines must be able to read `path`).
"""

from __future__ import annotations

import asyncio
import logging
import time

from rollout_service.engines.base import Engine, EngineError
from rollout_service.engines.kinds import make_engine
from scheduler.keys import Keys
from scheduler.registry import Registry
from wire import EngineInfo, EngineUpdateResult, LoadedWeights, WeightUpdate, WeightUpdateResult

log = logging.getLogger(__name__)

KEEP_S = 5.0  # how often a gateway compares each engine's start time with its weights' (a `/metrics` read)
RELOAD_LOCK_S = 600  # one gateway reloads an engine at a time; a lock left by a dead one lapses after this


async def started_at(engine: Engine) -> float | None:
    """The engine process's start time, where its kind can tell (None otherwise)."""
    ask = getattr(engine, "started_at", None)
    return await ask() if ask is not None else None


def restarted(info: EngineInfo, started: float | None) -> bool:
    """Whether the engine's process started after its last weight update loaded: it no longer
    holds those weights. False where either start time is unknown (nothing to compare)."""
    w = info.weights
    return w is not None and w.engine_started_at is not None and started is not None and \
        started > w.engine_started_at


class WeightUpdater:
    def __init__(self, registry: Registry):
        self.registry = registry

    async def update(self, req: WeightUpdate) -> WeightUpdateResult:
        engines = await self.registry.engines()
        if req.engines is not None:
            unknown = set(req.engines) - {e.id for e in engines}
            if unknown:
                raise KeyError(", ".join(sorted(unknown)))
            engines = [e for e in engines if e.id in req.engines]
        version = req.version if req.version is not None else max((e.policy_version for e in engines), default=0) + 1
        results = await asyncio.gather(*(self._one(e, req.path, req.lora_name, version) for e in engines))
        return WeightUpdateResult(ok=all(r.ok for r in results), version=version, results=list(results))

    async def _one(self, e: EngineInfo, path: str, lora_name: str | None, version: int) -> EngineUpdateResult:
        t0 = time.perf_counter()
        try:
            engine = make_engine(e)
        except ValueError as err:
            return EngineUpdateResult(engine_id=e.id, ok=False, seconds=0.0, error=str(err))
        try:
            started = await started_at(engine)  # (read before: a restart during the load shows as a later one)
            loaded = LoadedWeights(path=path, lora_name=lora_name, engine_started_at=started)
            await engine.update_weights(path, lora_name, lambda: self.registry.set_policy_version(
                e.id, version, model=lora_name, weights=loaded))
            return EngineUpdateResult(engine_id=e.id, ok=True, seconds=time.perf_counter() - t0)
        except (EngineError, KeyError) as err:
            return EngineUpdateResult(engine_id=e.id, ok=False, seconds=time.perf_counter() - t0, error=str(err))
        finally:
            await engine.aclose()


class WeightKeeper:
    """Loads an engine's last pushed weights again when it restarted without them (see above)."""

    def __init__(self, registry: Registry, keys: Keys, every_s: float = KEEP_S):
        self.registry, self.k, self.every_s = registry, keys, every_s
        self.updater = WeightUpdater(registry)
        self._clients: dict[str, tuple[str, Engine]] = {}  # engine id -> (its URL, a client kept for it)

    async def run(self) -> None:
        try:
            while True:
                try:
                    await self.once()
                except Exception:  # Redis away, an engine unreachable: the next pass looks again
                    log.warning("weight keeper pass failed", exc_info=True)
                await asyncio.sleep(self.every_s)
        finally:
            await self.aclose()

    async def once(self) -> list[str]:
        """One pass over the engines; returns the ids whose weights were loaded again."""
        done, infos = [], await self.registry.engines()
        for gone in set(self._clients) - {i.id for i in infos}:
            await self._clients.pop(gone)[1].aclose()
        for info in infos:
            if info.weights is None or info.weights.engine_started_at is None:
                continue
            engine = await self._client(info)
            if engine is None:
                continue
            try:
                started = await started_at(engine)
            except EngineError:
                continue  # down (restarting?): the next pass looks again
            if restarted(info, started) and await self._reload(info):
                done.append(info.id)
        return done

    async def _client(self, info: EngineInfo) -> Engine | None:
        kept = self._clients.get(info.id)
        if kept is not None and kept[0] == info.url:
            return kept[1]
        if kept is not None:
            await kept[1].aclose()
        try:
            engine = make_engine(info)
        except ValueError:  # a kind this process does not know
            self._clients.pop(info.id, None)
            return None
        self._clients[info.id] = (info.url, engine)
        return engine

    async def aclose(self) -> None:
        for _, engine in self._clients.values():
            await engine.aclose()
        self._clients.clear()

    async def _reload(self, info: EngineInfo) -> bool:
        lock = self.k.weights_reload(info.id)
        if not await self.registry.r.set(lock, "1", nx=True, ex=RELOAD_LOCK_S):
            return False  # another gateway is at it
        try:
            w = info.weights
            log.warning("engine restarted without its pushed weights; loading them again", extra={
                "engine_id": info.id, "policy_version": info.policy_version, "path": w.path})
            got = await self.updater._one(info, w.path, w.lora_name, info.policy_version)
            if not got.ok:
                log.warning("could not load an engine's pushed weights again; it serves no turn until it can",
                            extra={"engine_id": info.id, "error": got.error})
            return got.ok
        finally:
            await self.registry.r.delete(lock)
