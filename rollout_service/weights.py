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
(`EngineInfo.weights`); a fleet's probe keeps an engine whose process started later out of
rotation (`Fleet.probe`), and `WeightKeeper`, in every gateway, loads the same weights into it
again under the same version (one gateway at a time per engine: a lock in Redis).

Non-goals: distributing the checkpoint (engines must be able to read `path`).
"""

from __future__ import annotations

import asyncio
import logging
import time

from rollout_service.engines.base import EngineError
from rollout_service.engines.fleet import Fleet, started_at
from rollout_service.engines.kinds import make_engine
from scheduler.keys import Keys
from scheduler.registry import Registry
from wire import EngineInfo, EngineUpdateResult, LoadedWeights, WeightUpdate, WeightUpdateResult

log = logging.getLogger(__name__)

KEEP_S = 5.0  # how often a gateway probes its fleet (which reads start times: `Fleet._holds_weights`)
RELOAD_LOCK_S = 600  # one gateway reloads an engine at a time; a lock left by a dead one lapses after this


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
        results = await asyncio.gather(*(self.load(e, req.path, req.lora_name, version) for e in engines))
        return WeightUpdateResult(ok=all(r.ok for r in results), version=version, results=list(results))

    async def load(self, e: EngineInfo, path: str, lora_name: str | None, version: int) -> EngineUpdateResult:
        """Load `path` (or the adapter `lora_name`) into one engine as `version`; the result, never raised."""
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
    """Loads an engine's last pushed weights again when it restarted without them (see above).
    It probes `fleet` (its own: built from the registry) and reloads what the probe found stale."""

    def __init__(self, registry: Registry, keys: Keys, fleet: Fleet, every_s: float = KEEP_S):
        self.registry, self.k, self.fleet, self.every_s = registry, keys, fleet, every_s
        self.updater = WeightUpdater(registry)

    async def run(self) -> None:
        while True:
            try:
                await self.once()
            except Exception:  # Redis away, an engine unreachable: the next pass looks again
                log.warning("weight keeper pass failed", exc_info=True)
            await asyncio.sleep(self.every_s)

    async def once(self) -> list[str]:
        """One probe of the fleet; returns the ids whose weights were loaded again."""
        await self.fleet.probe()
        done = []
        for eid in sorted(self.fleet.stale):
            info = await self.registry.engine(eid)
            if info is not None and info.weights is not None and await self._reload(info):
                done.append(eid)
        return done

    async def _reload(self, info: EngineInfo) -> bool:
        lock = self.k.weights_reload(info.id)
        if not await self.registry.r.set(lock, "1", nx=True, ex=RELOAD_LOCK_S):
            return False  # another gateway is at it
        try:
            w = info.weights
            log.warning("engine restarted without its pushed weights; loading them again", extra={
                "engine_id": info.id, "policy_version": info.policy_version, "path": w.path})
            got = await self.updater.load(info, w.path, w.lora_name, info.policy_version)
            if not got.ok:
                log.warning("could not load an engine's pushed weights again; it serves no turn until it can",
                            extra={"engine_id": info.id, "error": got.error})
            return got.ok
        finally:
            await self.registry.r.delete(lock)
