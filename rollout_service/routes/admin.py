from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from rollout_service.routes.body import JsonRoute
from rollout_service.routes.deps import admin
from rollout_service.weights import WeightUpdater
from wire import (
    ApiKeyCreate,
    ApiKeyCreated,
    EngineInfo,
    EngineRoleUpdate,
    EngineStatus,
    ErrorResponse,
    WeightUpdate,
    WeightUpdateResult,
    WorkerInfo,
)
from wire.errors import Conflict, NotFound

router = APIRouter(route_class=JsonRoute, prefix="/v1", tags=["admin"], dependencies=[Depends(admin)],
                   responses={401: {"model": ErrorResponse}, 403: {"model": ErrorResponse},
                              404: {"model": ErrorResponse}})


@router.post("/keys", response_model=ApiKeyCreated, status_code=201)
async def create_key(request: Request, body: ApiKeyCreate) -> ApiKeyCreated:
    """Create an API key for a tenant. The key is shown once; only its hash is kept."""
    key = await request.app.state.api_keys.create(body.tenant, body.admin)
    return ApiKeyCreated(key=key, tenant=body.tenant, admin=body.admin)


@router.get("/engines", response_model=list[EngineStatus])
async def engines(request: Request) -> list[EngineStatus]:
    """Every registered engine, with whether the workers find it up and its tokens in flight."""
    registry = request.app.state.registry
    infos = await registry.engines()
    loads = await registry.engine_loads([e.id for e in infos])
    return [EngineStatus(**e.model_dump(), up=loads[e.id][1], inflight_tokens=loads[e.id][0]) for e in infos]


@router.post("/engines", response_model=EngineInfo, status_code=201)
async def register_engine(request: Request, body: EngineInfo) -> EngineInfo:
    """Register (or update) an engine; workers pick it up within seconds."""
    await request.app.state.registry.add_engine(body)
    return body


@router.put("/engines/{engine_id}/role", response_model=EngineInfo, responses={409: {"model": ErrorResponse}})
async def set_engine_role(request: Request, engine_id: str, body: EngineRoleUpdate) -> EngineInfo:
    """Make an engine take prefills, decodes, or both. Workers follow within seconds; every
    engine must serve with a KV connector for a prefill/decode split to work: a role the engine
    said it cannot serve (`can_serve`, detected by workers) is refused."""
    reg = request.app.state.registry
    info = await reg.engine(engine_id)
    if info is None:
        raise NotFound(f"no engine {engine_id!r}")
    if info.can_serve is not None and body.role not in info.can_serve:
        raise Conflict(f"engine {engine_id!r} cannot serve role {body.role!r}: {info.kv}",
                       {"can_serve": info.can_serve, "kv": info.kv})
    try:
        return await reg.set_role(engine_id, body.role)
    except KeyError:
        raise NotFound(f"no engine {engine_id!r}") from None


@router.delete("/engines/{engine_id}")
async def deregister_engine(request: Request, engine_id: str) -> dict:
    if not await request.app.state.registry.remove_engine(engine_id):
        raise NotFound(f"no engine {engine_id!r}")
    return {"removed": engine_id}


@router.get("/workers", response_model=list[WorkerInfo])
async def workers(request: Request) -> list[WorkerInfo]:
    """Live env workers (those heartbeating)."""
    return await request.app.state.registry.workers()


@router.post("/weights", response_model=WeightUpdateResult)
async def update_weights(request: Request, body: WeightUpdate) -> WeightUpdateResult:
    """Pause every engine, load the new weights (full or LoRA), clear the prefix cache,
    bump the policy version, resume. `ok` is False if any engine failed (see `results`)."""
    try:
        return await WeightUpdater(request.app.state.registry).update(body)
    except KeyError as e:
        raise NotFound(f"unknown engines: {e.args[0]}") from None
