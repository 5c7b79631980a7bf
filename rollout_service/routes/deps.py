"""Request dependencies: who is calling (API key -> principal) and what they may touch."""

from __future__ import annotations

import secrets

from fastapi import Request

from rollout_service.auth import OPEN, Principal
from wire import BatchStatus
from wire.errors import ApiError, NotFound

ADMIN = Principal("admin", admin=True)


class Unauthorized(ApiError):
    status, code = 401, "unauthorized"


class Forbidden(ApiError):
    status, code = 403, "forbidden"


async def principal(request: Request) -> Principal:
    s = request.app.state
    if not s.settings.auth_enabled:
        return OPEN
    header = request.headers.get("authorization", "")
    key = header[7:].strip() if header.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
    if not key:
        raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
    if s.settings.admin_key and secrets.compare_digest(key.encode(), s.settings.admin_key.encode()):
        return ADMIN  # the bootstrap key works from settings alone: a Redis flush cannot lock the operator out
    who = await s.api_keys.verify(key)
    if who is None:
        raise Unauthorized("invalid API key")
    return who


async def admin(request: Request) -> Principal:
    who = await principal(request)
    if not who.admin:
        raise Forbidden("this needs an admin key")
    return who


async def owned_batch(request: Request, bid: str, who: Principal) -> BatchStatus:
    """The batch, if it exists and `who` may see it; 404 otherwise (existence never leaks)."""
    status = await request.app.state.store.batch_status(bid)
    if status is None or (not who.admin and status.tenant != who.tenant):
        raise NotFound(f"no batch {bid!r}")
    return status
