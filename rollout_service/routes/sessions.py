"""OpenAI-compatible sessions: point any OpenAI client's base_url at
`{gateway}/v1/sessions/{id}` and every chat completion becomes a recorded turn."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Request

from rollout_service.auth import Principal
from rollout_service.engines.base import EngineError
from rollout_service.routes.deps import principal
from rollout_service.sessions import SessionClosed, SessionNotFound
from wire import (
    ChatCompletionRequest,
    ErrorResponse,
    SessionCreate,
    SessionCreated,
    SessionFinish,
    Trajectory,
)
from wire.errors import ApiError, Conflict, NotFound

router = APIRouter(prefix="/v1/sessions", tags=["sessions"],
                   responses={404: {"model": ErrorResponse}, 409: {"model": ErrorResponse}})
Caller = Depends(principal)


class EngineUnavailable(ApiError):
    status, code = 503, "engine_unavailable"


def _owner(who: Principal) -> str | None:
    return None if who.admin else who.tenant


@router.post("", response_model=SessionCreated, status_code=201)
async def create(request: Request, body: SessionCreate | None = None, who: Principal = Caller) -> SessionCreated:
    traj = await request.app.state.sessions.create(who.tenant, body or SessionCreate())
    return SessionCreated(id=traj.id, base_url_path=f"/v1/sessions/{traj.id}")


@router.get("/{sid}", response_model=Trajectory)
async def get(request: Request, sid: str, who: Principal = Caller) -> Trajectory:
    """The session so far, as a trajectory: exact token ids, logprobs and masks per call."""
    try:
        return await request.app.state.sessions.get(sid, _owner(who))
    except SessionNotFound:
        raise NotFound(f"no session {sid!r}") from None


@router.post("/{sid}/finish", response_model=Trajectory)
async def finish(request: Request, sid: str, body: SessionFinish, who: Principal = Caller) -> Trajectory:
    """End the session, optionally with the episode's reward."""
    try:
        return await request.app.state.sessions.finish(sid, _owner(who), body.reward)
    except SessionNotFound:
        raise NotFound(f"no session {sid!r}") from None


@router.post("/{sid}/chat/completions", responses={503: {"model": ErrorResponse}})
async def chat_completions(request: Request, sid: str, body: ChatCompletionRequest, who: Principal = Caller) -> dict:
    """OpenAI's chat completion, served with token-in/token-out underneath."""
    try:
        reply = await request.app.state.sessions.complete(sid, _owner(who), body)
    except SessionNotFound:
        raise NotFound(f"no session {sid!r}") from None
    except SessionClosed as e:
        raise Conflict(str(e)) from None
    except EngineError as e:
        raise EngineUnavailable(str(e)) from None
    return {
        "id": f"chatcmpl-{sid}-{int(time.time() * 1000)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": reply.text},
                     "finish_reason": reply.finish_reason if reply.finish_reason in ("stop", "length") else "stop",
                     "logprobs": None}],
        "usage": {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
                  "total_tokens": reply.prompt_tokens + reply.completion_tokens},
    }
