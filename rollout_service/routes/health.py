from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz(request: Request) -> dict:
    """Liveness plus a Redis round trip."""
    await request.app.state.queue.r.ping()
    return {"ok": True}


@router.get("/metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    s = request.app.state
    return Response(await s.metrics.render(s.queue, s.registry), media_type="text/plain; version=0.0.4")
