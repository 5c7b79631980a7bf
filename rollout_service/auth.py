"""API keys and tenants.

A key is a random token shown once; Redis keeps only its SHA-256, mapped to a principal
(tenant, admin flag). Every batch belongs to the tenant that submitted it, and another
tenant asking for it gets 404 (not 403), so existence does not leak. Admin keys manage
engines, workers, weights and keys, and may read every batch.

Auth is on when the gateway has an admin key (`ROLLOUT_ADMIN_KEY`, registered at start)
or `ROLLOUT_AUTH=1`; off, every caller is the admin of tenant `default` (local use).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import asdict, dataclass

import redis.asyncio as aioredis

from scheduler.keys import Keys


@dataclass(slots=True, frozen=True)
class Principal:
    tenant: str
    admin: bool = False


OPEN = Principal("default", admin=True)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class ApiKeys:
    def __init__(self, redis: aioredis.Redis, keys: Keys):
        self.r, self.k = redis, keys

    async def create(self, tenant: str, admin: bool = False) -> str:
        key = f"rk-{secrets.token_urlsafe(24)}"
        await self.add(key, Principal(tenant, admin))
        return key

    async def add(self, key: str, principal: Principal) -> None:
        await self.r.set(self.k.apikey(hash_key(key)), json.dumps(asdict(principal)))

    async def verify(self, key: str) -> Principal | None:
        raw = await self.r.get(self.k.apikey(hash_key(key)))
        return Principal(**json.loads(raw)) if raw else None

    async def revoke(self, key: str) -> bool:
        return bool(await self.r.delete(self.k.apikey(hash_key(key))))
