"""Weight updates: one call moves every engine to a new policy version.

For each engine, concurrently, its kind's `update_weights` (for vLLM: pause, load, clear the
prefix cache, resume), recording the new version in the registry while its requests are
still frozen. Frozen requests finish on the new weights, and the worker labels a turn with
the version serving when it finished.

An engine that fails any step is still resumed, and reported; its version is not bumped.
Non-goals: distributing the checkpoint (engines must be able to read `path`).
"""

from __future__ import annotations

import asyncio
import time

from rollout_service.engines.base import EngineError
from rollout_service.engines.kinds import make_engine
from scheduler.registry import Registry
from wire import EngineInfo, EngineUpdateResult, WeightUpdate, WeightUpdateResult


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
        results = await asyncio.gather(*(self._one(e, req, version) for e in engines))
        return WeightUpdateResult(ok=all(r.ok for r in results), version=version, results=list(results))

    async def _one(self, e: EngineInfo, req: WeightUpdate, version: int) -> EngineUpdateResult:
        t0 = time.perf_counter()
        try:
            engine = make_engine(e)
        except ValueError as err:
            return EngineUpdateResult(engine_id=e.id, ok=False, seconds=0.0, error=str(err))
        try:
            await engine.update_weights(req.path, req.lora_name,
                                        lambda: self.registry.set_policy_version(e.id, version, model=req.lora_name))
            return EngineUpdateResult(engine_id=e.id, ok=True, seconds=time.perf_counter() - t0)
        except (EngineError, KeyError) as err:
            return EngineUpdateResult(engine_id=e.id, ok=False, seconds=time.perf_counter() - t0, error=str(err))
        finally:
            await engine.aclose()
