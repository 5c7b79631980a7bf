"""The engines a worker can use: discovered from Redis (or given), picked by a routing
policy, with in-flight token accounting and failover to another engine on error."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from rollout_service.engines.base import Engine, EngineError, GenerateRequest, GenerateResult
from rollout_service.engines.vllm import VLLMEngine
from rollout_service.protocol import EngineInfo
from rollout_service.tokens import Tokenizer, load_tokenizer
from scheduler.router import NoEngine, RoutingPolicy, StickyLeastLoaded


class Fleet:
    def __init__(self, engines: dict[str, tuple[Engine, str]] | None = None,
                 policy: RoutingPolicy | None = None, attempts: int = 3,
                 discover: Callable | None = None, refresh_s: float = 2.0):
        """`engines`: id -> (engine, tokenizer spec). `discover`: async () -> list[EngineInfo]."""
        self._engines: dict[str, tuple[Engine, str]] = dict(engines or {})
        self.policy = policy or StickyLeastLoaded()
        self.attempts = attempts
        self._discover = discover
        self._refresh_s = refresh_s
        self._refreshed = 0.0
        self._load: dict[str, int] = {e: 0 for e in self._engines}
        self._down: dict[str, float] = {}  # engine id -> until (monotonic)

    async def refresh(self, force: bool = False) -> None:
        if self._discover is None or (not force and time.monotonic() - self._refreshed < self._refresh_s):
            return
        infos: list[EngineInfo] = await self._discover()
        self._refreshed = time.monotonic()
        seen = set()
        for info in infos:
            seen.add(info.id)
            cur = self._engines.get(info.id)
            if cur is None or getattr(cur[0], "url", None) != info.url.rstrip("/"):
                self._engines[info.id] = (VLLMEngine(info.id, info.url, info.model, info.policy_version),
                                          info.tokenizer)
                self._load.setdefault(info.id, 0)
            else:
                cur[0].policy_version = info.policy_version
        for gone in set(self._engines) - seen:
            eng, _ = self._engines.pop(gone)
            await eng.aclose()

    def _available(self, tokenizer: str | None) -> dict[str, int]:
        """Loads of the engines that can serve; ones that just failed only if nothing else can."""
        now = time.monotonic()
        able = {e: self._load.get(e, 0) for e, (_, tok) in self._engines.items()
                if tokenizer is None or tok == tokenizer}
        healthy = {e: n for e, n in able.items() if self._down.get(e, 0) <= now}
        return healthy or able

    async def tokenizer_for(self, trajectory_id: str) -> tuple[str, Tokenizer]:
        """The tokenizer of the engine a new trajectory will start on."""
        await self.refresh()
        try:
            eid = self.policy.pick(trajectory_id, self._available(None))
        except NoEngine as e:
            raise EngineError("no engine registered") from e
        spec = self._engines[eid][1]
        return spec, await asyncio.to_thread(load_tokenizer, spec)

    async def generate(self, trajectory_id: str, tokenizer: str, req: GenerateRequest) -> GenerateResult:
        """Serve one turn, failing over to another engine (same tokenizer) on error."""
        last: Exception | None = None
        for _ in range(self.attempts):
            await self.refresh()
            loads = self._available(tokenizer)
            if not loads:
                await self.refresh(force=True)
                loads = self._available(tokenizer)
            try:
                eid = self.policy.pick(trajectory_id, loads)
            except NoEngine as e:
                raise EngineError(f"no engine available for tokenizer {tokenizer!r}") from (last or e)
            engine, _ = self._engines[eid]
            cost = len(req.prompt_ids) + req.sampling.max_tokens
            self._load[eid] = self._load.get(eid, 0) + cost
            try:
                return await engine.generate(req)
            except EngineError as e:
                last = e
                self._down[eid] = time.monotonic() + 5.0  # out of rotation briefly
                self.policy.forget(trajectory_id)
            finally:
                self._load[eid] -= cost
        raise EngineError(f"turn failed on {self.attempts} engine attempts: {last}")

    def forget(self, trajectory_id: str) -> None:
        self.policy.forget(trajectory_id)

    async def aclose(self) -> None:
        for eng, _ in self._engines.values():
            await eng.aclose()
