"""Weight updates: one call moves every engine to a new policy version.

For each engine, concurrently: pause (in-flight requests freeze, `mode=keep`), load the
new weights (vLLM's `reload_weights` through `/collective_rpc`, or a runtime LoRA adapter
loaded in place), clear the prefix cache (stale KV would mix policies), record the new
version in the registry, resume. Frozen requests finish on the new weights, and the worker
labels a turn with the version serving when it finished.

An engine that fails any step is still resumed, and reported; its version is not bumped.
Non-goals: distributing the checkpoint (engines must be able to read `path`).
"""

from __future__ import annotations

import asyncio
import time

import httpx

from rollout_service.protocol import EngineInfo, EngineUpdateResult, WeightUpdate, WeightUpdateResult
from scheduler.registry import Registry


class WeightUpdater:
    def __init__(self, registry: Registry, client: httpx.AsyncClient | None = None, timeout_s: float = 300.0):
        self.registry = registry
        self._client = client or httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=5.0))

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

    async def _post(self, url: str, **kw) -> None:
        r = await self._client.post(url, **kw)
        if r.status_code >= 400:
            raise RuntimeError(f"{url} answered {r.status_code}: {r.text[:300]}")

    async def _one(self, e: EngineInfo, req: WeightUpdate, version: int) -> EngineUpdateResult:
        base, t0 = e.url.rstrip("/"), time.perf_counter()
        paused = False
        try:
            await self._post(f"{base}/pause", params={"mode": "keep"})
            paused = True
            if req.lora_name is None:
                await self._post(f"{base}/collective_rpc",
                                 json={"method": "reload_weights", "kwargs": {"weights_path": req.path}})
            else:
                await self._post(f"{base}/v1/load_lora_adapter",
                                 json={"lora_name": req.lora_name, "lora_path": req.path, "load_inplace": True})
            await self._post(f"{base}/reset_prefix_cache")
            await self.registry.set_policy_version(e.id, version, model=req.lora_name)
            return EngineUpdateResult(engine_id=e.id, ok=True, seconds=time.perf_counter() - t0)
        except (httpx.HTTPError, httpx.InvalidURL, RuntimeError, KeyError) as err:
            return EngineUpdateResult(engine_id=e.id, ok=False, seconds=time.perf_counter() - t0, error=str(err))
        finally:
            if paused:
                try:
                    await self._post(f"{base}/resume")
                except (httpx.HTTPError, httpx.InvalidURL, RuntimeError):
                    pass  # reported through the health probe: an engine that stays paused stops answering

    async def aclose(self) -> None:
        await self._client.aclose()
