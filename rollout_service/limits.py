"""Input bounds: what one request may carry, and how much work a tenant may have open.

    request body      > max_request_bytes              413 too_large (declared or streamed)
    tasks × group     > max_trajectories_per_batch     422 too_many_trajectories
    one task's JSON   > max_task_bytes                 422 task_too_large (names the task)
    open per tenant   > max_open_per_tenant            429 tenant_quota + Retry-After

All four come from `Settings` (env `ROLLOUT_*`); the first three are refused before anything
reaches Redis. The tenant quota needs the tenant's live count, so the enqueue script checks and
counts it atomically (`scheduler.queue.Queue.enqueue`); `quota_exceeded` makes its refusal the 429.
Non-goal: rate limiting (requests per second); these bound size and outstanding work.
"""

from __future__ import annotations

import json

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse

from rollout_service.config import Settings
from scheduler.queue import QuotaExceeded
from wire import RolloutRequest
from wire.errors import ApiError, Overloaded, error_body

# What a 429 tells the caller to wait: open trajectories finish at the fleet's pace, which the
# gateway does not know; a few seconds keeps a polling trainer cheap without sleeping long.
QUOTA_RETRY_AFTER_S = 5


def check_batch(req: RolloutRequest, settings: Settings) -> None:
    """Raise a 422 if the batch is bigger than one request may be (see the table above)."""
    n = req.num_trajectories
    cap = settings.max_trajectories_per_batch
    if settings.max_open_per_tenant > 0 and settings.max_open_per_tenant < cap:
        cap = settings.max_open_per_tenant  # more than the quota can never be queued: say so now, not 429
    if n > cap:
        raise ApiError(f"{len(req.tasks)} tasks × group_size {req.group_size} = {n} trajectories; "
                       f"at most {cap} per batch", {"trajectories": n, "limit": cap},
                       status=422, code="too_many_trajectories")
    for i, task in enumerate(req.tasks):
        size = len(json.dumps(task).encode())  # the form the queue stores, once per trajectory
        if size > settings.max_task_bytes:
            raise ApiError(f"task {i} is {size} bytes as JSON; at most {settings.max_task_bytes}",
                           {"task_index": i, "bytes": size, "limit": settings.max_task_bytes},
                           status=422, code="task_too_large")


def quota_exceeded(exc: QuotaExceeded) -> Overloaded:
    return Overloaded(str(exc), {"open": exc.open, "requested": exc.requested, "limit": exc.limit},
                      code="tenant_quota", headers={"Retry-After": str(QUOTA_RETRY_AFTER_S)})


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int):
        super().__init__(413, f"request body over {limit} bytes")


class BodyLimit:
    """ASGI middleware: 413 for a body over `limit` bytes, whether its Content-Length says so
    (answered before reading a byte) or a chunked body streams past it (the read that crosses
    the limit raises, the route never sees the body)."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            return await self._reject(scope, receive, send)
        seen, started = 0, False

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise BodyTooLarge(self.limit)  # the app's HTTPException handler renders it
            return message

        async def tracked(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except BodyTooLarge:
            if started:
                raise
            await self._reject(scope, receive, send)  # read outside a route: nothing rendered it

    async def _reject(self, scope, receive, send):
        response = JSONResponse(error_body("too_large", f"request body over {self.limit} bytes"), status_code=413)
        await response(scope, receive, send)
