from __future__ import annotations

import asyncio
import difflib
import json
import re

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import StreamingResponse

from rollout_service import limits
from rollout_service.auth import Principal
from rollout_service.routes import formats
from rollout_service.routes.body import JsonRoute
from rollout_service.routes.deps import owned_batch, principal
from scheduler.keys import batch_of
from scheduler.queue import IdempotencyConflict, QuotaExceeded
from scheduler.results import plain
from wire import (
    BatchCreated,
    BatchStatus,
    ErrorResponse,
    GroupStatus,
    RolloutRequest,
    StateRules,
    Trajectory,
    TrajectoryPage,
    TrajectoryState,
)
from wire.errors import ApiError, Conflict, NotFound
from wire.packed import MEDIA_TYPE, with_samples

router = APIRouter(route_class=JsonRoute, prefix="/v1", tags=["batches"],
                   responses={404: {"model": ErrorResponse}, 422: {"model": ErrorResponse}})


Caller = Depends(principal)


_QUOTA = {"model": ErrorResponse, "description": "The tenant has too many trajectories queued or running",
          "headers": {"Retry-After": {"description": "Seconds to wait before trying again",
                                      "schema": {"type": "integer"}}}}


@router.get("/states", response_model=StateRules)
async def states() -> StateRules:
    """Which trajectory states are terminal (never change again) and which usable (fit for the
    loss): the one rule, for clients that cannot import `wire` (the board). No auth: no data."""
    return StateRules.current()


@router.post("/batches", response_model=BatchCreated, status_code=202,
             responses={429: _QUOTA, 409: {"model": ErrorResponse, "description": "The idempotency key names a "
                                           "batch submitted with a different request"}})
async def submit(request: Request, body: RolloutRequest, who: Principal = Caller) -> BatchCreated:
    """Queue a batch and return at once. The same `idempotency_key` returns the same batch.
    Bounded: tasks × group_size, bytes per task, and the tenant's open trajectories (429).
    Claimed in weighted fair share across tenants, then by `priority` among the tenant's batches."""
    settings = request.app.state.settings
    limits.check_batch(body, settings)
    known = await request.app.state.registry.unhosted(body.env)
    if known is not None:
        raise unknown_env(body.env, known)
    refused = await request.app.state.env_names.refused(body.env)
    if refused is not None:  # a FAMILY:NAME its env workers cannot run (`rollout_service.env_names`)
        raise ApiError(refused[1], {"env": body.env}, status=422,
                       code="unknown_env" if refused[0] == "not_found" else refused[0])
    try:
        created = await request.app.state.queue.enqueue(
            body, tenant=who.tenant, max_open=settings.max_open_per_tenant,
            weight=settings.tenant_weight(who.tenant), max_running=settings.max_running_per_tenant)
    except QuotaExceeded as exc:
        raise limits.quota_exceeded(exc) from None
    except IdempotencyConflict as exc:
        raise Conflict(str(exc), {"idempotency_key": exc.key, "batch_id": exc.batch_id},
                       code="idempotency_conflict") from None
    if created.created:
        request.app.state.metrics.batches.inc()
    return created


def unknown_env(env: str, known: list[str]) -> ApiError:
    """A batch for an env no registered env worker hosts (a typo, say): a 422 naming the nearest
    known name, instead of a batch whose every trajectory ends `rejected`."""
    near = difflib.get_close_matches(env, known, n=1, cutoff=0.6)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    return ApiError(f"no env worker hosts an environment named {env!r}{hint} (hosted: {', '.join(known)})",
                    {"env": env, "hosted": known}, status=422, code="unknown_env")


@router.get("/batches", response_model=list[BatchStatus])
async def list_batches(request: Request, limit: int = Query(20, ge=1, le=200),
                       who: Principal = Caller) -> list[BatchStatus]:
    store = request.app.state.store
    out = [await store.batch_status(b) for b in await store.list_batches(limit, None if who.admin else who.tenant)]
    return [s for s in out if s is not None]


@router.get("/batches/{bid}", response_model=BatchStatus)
async def status(request: Request, bid: str, who: Principal = Caller) -> BatchStatus:
    return await owned_batch(request, bid, who)


@router.get("/batches/{bid}/request", response_model=RolloutRequest)
async def batch_request(request: Request, bid: str, who: Principal = Caller) -> RolloutRequest:
    """The batch as submitted: its parameters and its tasks, one per group in group order
    (what `rollout export` records, so that a recording is self-contained)."""
    await owned_batch(request, bid, who)
    got = await request.app.state.store.request(bid)
    if got is None:
        raise NotFound(f"no batch {bid!r}")
    return got


# A cursor is an offset into the batch; Redis takes signed 64-bit offsets, and no batch comes near
# 2**53 (the largest integer every JSON client reads exactly), so larger ones are refused as input.
CURSOR_MAX = 2**53

SAMPLES = ("Also return `training_samples`: per training sample, `token_ids`, `loss_mask` (1 where sampled) and "
           "`logprobs` (0.0 where the mask is 0), aligned, ready for the loss")


@router.get("/batches/{bid}/trajectories", response_model=TrajectoryPage, responses=formats.RESPONSES)
async def trajectories(request: Request, bid: str, cursor: int = Query(0, ge=0, le=CURSOR_MAX), limit: int = Query(50, ge=1, le=500),
                       state: TrajectoryState | None = None, samples: bool = Query(False, description=SAMPLES),
                       who: Principal = Caller) -> TrajectoryPage | Response:
    """A page of the batch's trajectories in submission order; pass `next_cursor` back.
    `Accept: application/msgpack` answers in the compact form (token arrays packed)."""
    kind = formats.negotiate(request.headers.get("accept"))
    await owned_batch(request, bid, who)
    store = request.app.state.store
    if kind == MEDIA_TYPE:
        packed, nxt = await store.trajectories_packed(bid, cursor, limit, state)
        return formats.packed_response([with_samples(plain(p)) for p in packed] if samples else packed,
                                       formats.zstd_ok(request.headers.get("accept-encoding")), page=(nxt,))
    items, nxt = await store.trajectories(bid, cursor, limit, state)
    return TrajectoryPage(items=[t.with_samples() for t in items] if samples else items, next_cursor=nxt)


@router.get("/batches/{bid}/groups", response_model=list[GroupStatus])
async def groups(request: Request, bid: str, who: Principal = Caller) -> list[GroupStatus]:
    """GRPO groups: per task, how many members are done and usable, and their rewards."""
    await owned_batch(request, bid, who)
    return await request.app.state.store.groups(bid)


@router.get("/trajectories/{tid}", response_model=Trajectory, responses=formats.RESPONSES)
async def trajectory(request: Request, tid: str, samples: bool = Query(False, description=SAMPLES),
                     who: Principal = Caller) -> Trajectory | Response:
    """One trajectory; `Accept: application/msgpack` answers in the compact form."""
    kind = formats.negotiate(request.headers.get("accept"))
    store = request.app.state.store
    if not who.admin and await store.batch_tenant(batch_of(tid)) != who.tenant:
        raise NotFound(f"no trajectory {tid!r}")
    if kind == MEDIA_TYPE:
        packed = await store.trajectory_packed(tid)
        if packed is None:
            raise NotFound(f"no trajectory {tid!r}")
        return formats.packed_response([with_samples(plain(packed)) if samples else packed],
                                       formats.zstd_ok(request.headers.get("accept-encoding")))
    traj = await store.trajectory(tid)
    if traj is None:
        raise NotFound(f"no trajectory {tid!r}")
    return traj.with_samples() if samples else traj


EVENT_ID = r"^\d{1,20}(-\d{1,20})?$"  # a Redis stream id, as the `id:` lines carry it


@router.get("/batches/{bid}/events", response_class=StreamingResponse,
            responses={200: {"content": {"text/event-stream": {}}}})
async def events(request: Request, bid: str, last_event_id: str | None = Query(None, alias="after", pattern=EVENT_ID),
                 who: Principal = Caller) -> StreamingResponse:
    """Server-sent events: one `trajectory` event per finished trajectory, then `done`.
    Resumable: reconnect with the `Last-Event-ID` header (or `?after=`)."""
    await owned_batch(request, bid, who)
    store, block = request.app.state.store, request.app.state.settings.sse_block_ms
    after = request.headers.get("last-event-id") or last_event_id or "0"
    if not re.fullmatch(EVENT_ID, after):
        raise ApiError(f"Last-Event-ID {after!r} is not an event id (an `id:` line this stream sent)",
                       status=422, code="invalid_request")

    async def stream():
        nonlocal after
        yield ": connected\n\n"
        while not await request.is_disconnected():
            got = await store.events(bid, after, block_ms=block)
            if not got and await store.finished(bid):  # nothing after `after` in a finished batch...
                got = await store.events(bid, after, block_ms=None)  # (...unless it finished just now)
                if not got:  # resumed at or past its `done` (a reconnect that had it): `done` again, not a hang
                    yield f"id: {after}\nevent: done\ndata: {json.dumps({'batch_id': bid})}\n\n"
                    return
            if not got:
                yield ": keepalive\n\n"
                continue
            for eid, ev in got:
                after = eid
                if ev is None:
                    yield f"id: {eid}\nevent: done\ndata: {json.dumps({'batch_id': bid})}\n\n"
                    return
                yield f"id: {eid}\nevent: trajectory\ndata: {ev.model_dump_json()}\n\n"
            await asyncio.sleep(0)

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@router.delete("/batches/{bid}", response_model=BatchStatus)
async def cancel(request: Request, bid: str, who: Principal = Caller) -> BatchStatus:
    """Cancel: queued trajectories end now, running ones within a heartbeat."""
    await owned_batch(request, bid, who)
    await request.app.state.queue.cancel(bid)
    return await owned_batch(request, bid, who)
