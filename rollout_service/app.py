"""The gateway: validates, persists and reads. It never runs an episode.

    app = create_app(Settings.from_env())      # uvicorn rollout_service.app:main --factory

`lifespan` connects Redis and fills `app.state` (queue, store, registry, metrics); tests
may pass their own Redis client instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import redis.asyncio as aioredis
from fastapi import FastAPI, Request

from rollout_service import __version__, errors
from rollout_service.auth import ApiKeys, Principal
from rollout_service.config import Settings
from rollout_service.engines.fleet import Fleet
from rollout_service.env_names import FamilyNames
from rollout_service.limits import BodyLimit
from rollout_service.metrics import Metrics
from rollout_service.routes import admin, batches, board, docs, health, sessions
from rollout_service.sessions import Sessions
from rollout_service.weights import WeightKeeper
from scheduler.connection import connect
from scheduler.keys import Keys
from scheduler.queue import Queue
from scheduler.registry import Registry
from scheduler.results import result_store
from scheduler.retention import Retention
from scheduler.store import Store
from wire import ErrorResponse

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None, redis: aioredis.Redis | None = None) -> FastAPI:
    settings = settings or Settings.from_env()
    settings.tenant_weight("")  # a malformed ROLLOUT_TENANT_WEIGHTS fails here, at start

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        r = redis or connect(settings.redis_url)
        keys = Keys(settings.key_prefix)
        app.state.settings = settings
        results = result_store(settings.result_store)
        app.state.queue = Queue(r, keys, settings.lease_s, settings.max_attempts, settings.max_restarts,
                                replicas=settings.wait_replicas, longest_first=settings.longest_first,
                                results=results)
        app.state.store = Store(r, keys, results)
        app.state.registry = Registry(r, keys)
        app.state.metrics = Metrics()
        app.state.api_keys = ApiKeys(r, keys)
        app.state.sessions = Sessions(r, keys, Fleet(registry=app.state.registry))
        app.state.env_names = FamilyNames(app.state.registry)
        if settings.admin_key:
            await app.state.api_keys.add(settings.admin_key, Principal("admin", admin=True))
        sweeper = asyncio.create_task(_sweep_forever(Retention(r, keys, results, settings.result_retention_s),
                                                     settings.retention_sweep_s))
        keeper_fleet = Fleet(registry=app.state.registry)  # (probed by the keeper alone)
        keeper = asyncio.create_task(WeightKeeper(app.state.registry, keys, keeper_fleet).run())
        yield
        sweeper.cancel()
        keeper.cancel()
        await asyncio.gather(sweeper, keeper, return_exceptions=True)
        await app.state.sessions.fleet.aclose()
        await keeper_fleet.aclose()
        await app.state.env_names.aclose()
        if redis is None:
            await r.aclose()

    common = {code: {"model": ErrorResponse, "description": why} for code, why in (
        (400, "Malformed request body"), (401, "Missing or invalid API key"), (413, "Request body too large"),
        (422, "Request failed validation"),
        (503, "Redis unreachable (restarting?): `redis_unavailable`; try again after `Retry-After` seconds"))}
    app = FastAPI(title="rollout-service", version=__version__, lifespan=lifespan, responses=common,
                  description="Rollout-as-a-service for RL training of multi-turn LLM agents.",
                  docs_url=None, redoc_url=None)  # served offline by routes.docs
    errors.install(app)
    # Added first, so inside `count` (which sees its 413s): Starlette's BaseHTTPMiddleware would
    # wrap the 413 raised while a route reads the body in an ExceptionGroup, and FastAPI make it a 400.
    app.add_middleware(BodyLimit, limit=settings.max_request_bytes)

    @app.middleware("http")
    async def count(request: Request, call_next):
        response = await call_next(request)
        route = request.scope.get("route")
        metrics = getattr(request.app.state, "metrics", None)
        if metrics is not None:
            metrics.requests.labels(route=getattr(route, "path", "unmatched"), status=str(response.status_code)).inc()
        return response

    docs.install(app)
    app.include_router(health.router)
    app.include_router(batches.router)
    app.include_router(admin.router)
    app.include_router(board.router)
    app.include_router(sessions.router)
    return app


async def _sweep_forever(retention: Retention, every_s: float) -> None:
    """Expire finished batches (every gateway sweeps; the sweep is safe to run concurrently)."""
    while retention.retention_s > 0:
        try:
            if gone := await retention.sweep():
                log.info("expired finished batches", extra={"batches": len(gone)})
        except Exception:  # Redis away or a blob store hiccup: the next sweep tries again
            log.warning("retention sweep failed", exc_info=True)
        await asyncio.sleep(every_s)


def main() -> FastAPI:
    """Factory for `uvicorn --factory rollout_service.app:main`."""
    return create_app(Settings.from_env())
