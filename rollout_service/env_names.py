"""Whether a `FAMILY:NAME` environment can run, asked before a batch is queued.

An env worker announces a third-party family as `FAMILY:*` (its package is installed), not each
name in it: a name is resolved when an episode opens it. So `reasoning_gym:leg_countng` passed
the gateway's check and every trajectory of the batch ended `rejected`. The gateway now asks one
live env worker hosting the family (`GET /v1/envs/{name}`, which resolves it as opening a session
would) and refuses the batch with the worker's reason (a did-you-mean where the family can tell).
A worker that does not answer in `timeout_s` lets the batch through: the episodes judge it then,
as before. Names found runnable are remembered (the most recent `KEPT`).

Non-goals: built-in names (the registry's announcement lists them: `Registry.unhosted`).
"""

from __future__ import annotations

from collections import OrderedDict

import httpx

from env_workers.client import EnvWorkerLost, refused_env
from scheduler.registry import Registry

KEPT = 1024


class FamilyNames:
    def __init__(self, registry: Registry, timeout_s: float = 10.0):
        self.registry = registry
        # (the first name of a family imports its package in the worker: seconds, once)
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=2.0))
        self._runnable: OrderedDict[str, None] = OrderedDict()

    async def refused(self, env: str) -> tuple[str, str] | None:
        """(error code, reason) when a live env worker hosting `env`'s family says it cannot run
        it; None for a built-in name, a name known runnable, or no answer."""
        if ":" not in env or env in self._runnable:
            return None
        try:
            url = await self.registry.pick_worker(env)
        except (LookupError, ValueError):  # none live (judged later), or none hosts it (`unhosted` said so)
            return None
        try:
            got = await refused_env(self._client, url, env)
        except EnvWorkerLost:
            return None
        if got is None:
            self._runnable[env] = None
            if len(self._runnable) > KEPT:
                self._runnable.popitem(last=False)
        return got

    async def aclose(self) -> None:
        await self._client.aclose()
