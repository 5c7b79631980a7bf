"""OpenAI-compatible sessions: point any OpenAI client's base_url at
`{gateway}/v1/sessions/{id}` and every chat completion becomes a recorded turn."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse

from rollout_service.auth import Principal
from rollout_service.engines.base import EngineError, EngineRejected
from rollout_service.routes.batches import SAMPLES
from rollout_service.routes.body import JsonRoute
from rollout_service.routes.deps import principal
from rollout_service.sessions import Choice, Delta, Reply, SessionClosed, SessionNotFound
from wire import (
    ChatCompletionRequest,
    ErrorResponse,
    ResponsesRequest,
    SessionCreate,
    SessionCreated,
    SessionFinish,
    Trajectory,
)
from wire.errors import ApiError, Conflict, NotFound

T = TypeVar("T")
router = APIRouter(route_class=JsonRoute, prefix="/v1/sessions", tags=["sessions"],
                   responses={404: {"model": ErrorResponse}, 409: {"model": ErrorResponse}})
Caller = Depends(principal)


class EngineUnavailable(ApiError):
    status, code = 503, "engine_unavailable"


class EngineRefused(ApiError):
    """The engine refused the call as invalid (say a stop string it does not take): the caller's to fix."""
    status, code = 422, "engine_rejected"


def _owner(who: Principal) -> str | None:
    return None if who.admin else who.tenant


@router.post("", response_model=SessionCreated, status_code=201)
async def create(request: Request, body: SessionCreate | None = None, who: Principal = Caller) -> SessionCreated:
    traj = await request.app.state.sessions.create(who.tenant, body or SessionCreate())
    return SessionCreated(id=traj.id, base_url_path=f"/v1/sessions/{traj.id}")


@router.get("/{sid}", response_model=Trajectory)
async def get(request: Request, sid: str, samples: bool = Query(False, description=SAMPLES),
              who: Principal = Caller) -> Trajectory:
    """The session so far, as a trajectory: exact token ids, logprobs and masks per call."""
    try:
        traj = await request.app.state.sessions.get(sid, _owner(who))
    except SessionNotFound:
        raise NotFound(f"no session {sid!r}") from None
    return traj.with_samples() if samples else traj


@router.post("/{sid}/finish", response_model=Trajectory)
async def finish(request: Request, sid: str, body: SessionFinish, who: Principal = Caller) -> Trajectory:
    """End the session, optionally with the episode's reward."""
    try:
        return await request.app.state.sessions.finish(sid, _owner(who), body.reward)
    except SessionNotFound:
        raise NotFound(f"no session {sid!r}") from None


@router.post("/{sid}/chat/completions", responses={503: {"model": ErrorResponse}})
async def chat_completions(request: Request, sid: str, body: ChatCompletionRequest, who: Principal = Caller):
    """OpenAI's chat completion, served with token-in/token-out underneath; with `stream`,
    as server-sent chunks while the engine samples (a stream and a plain answer record the
    same trajectory)."""
    head = {"id": f"chatcmpl-{sid}-{int(time.time() * 1000)}", "created": int(time.time()), "model": body.model}
    if body.stream:
        events = request.app.state.sessions.stream(sid, _owner(who), body)
        first = await _served(anext(events))  # errors before the first token answer as without a stream
        with_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(_sse(head, body.n, first, events, with_usage), media_type="text/event-stream")
    reply = await _served(_complete(request, sid, who, body))
    return {**head, "object": "chat.completion",
            "choices": [{"index": k, "message": _message(c), "finish_reason": c.finish_reason,
                         "logprobs": None if c.logprobs is None else {"content": c.logprobs, "refusal": None}}
                        for k, c in enumerate(reply.choices)],
            "usage": _usage(reply)}


@router.post("/{sid}/responses", responses={503: {"model": ErrorResponse}})
async def responses(request: Request, sid: str, body: ResponsesRequest, who: Principal = Caller) -> dict:
    """OpenAI's Responses API, for text and function calls: served as the chat completion it
    means, recorded the same way. The whole input each call (no `previous_response_id`)."""
    chat = body.chat
    reply = await _served(_complete(request, sid, who, chat))
    (c,) = reply.choices
    stamp = int(time.time() * 1000)
    output: list[dict] = []
    if c.content or not c.tool_calls:
        output.append({"type": "message", "id": f"msg_{sid[2:]}_{stamp}", "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": c.content or "", "annotations": [],
                                    "logprobs": []}]})
    output += [{"type": "function_call", "id": f"fc_{t.id}", "call_id": t.id, "name": t.function.name,
                "arguments": t.function.arguments, "status": "completed"} for t in c.tool_calls]
    cut = c.finish_reason == "length"
    return {"id": f"resp_{sid[2:]}_{stamp}", "object": "response", "created_at": time.time(), "model": body.model,
            "status": "incomplete" if cut else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None, "error": None,
            "instructions": body.instructions, "output": output,
            "parallel_tool_calls": body.parallel_tool_calls is not False, "tool_choice": chat.tool_choice or "auto",
            "tools": [t.model_dump(exclude_none=True) for t in body.tools or []],
            "temperature": body.temperature, "top_p": body.top_p,
            "max_output_tokens": body.max_output_tokens,
            "usage": {"input_tokens": reply.prompt_tokens, "output_tokens": reply.completion_tokens,
                      "total_tokens": reply.prompt_tokens + reply.completion_tokens,
                      "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}}


async def _complete(request: Request, sid: str, who: Principal, body: ChatCompletionRequest) -> Reply:
    return await request.app.state.sessions.complete(sid, _owner(who), body)


async def _served(aw: Awaitable[T]) -> T:
    """A session call's answer, its failures as our HTTP errors."""
    try:
        return await aw
    except SessionNotFound as e:
        raise NotFound(f"no session {e.args[0]!r}") from None
    except SessionClosed as e:
        raise Conflict(str(e)) from None
    except EngineRejected as e:
        raise EngineRefused(str(e)) from None
    except EngineError as e:
        raise EngineUnavailable(str(e)) from None


def _usage(reply: Reply) -> dict:
    return {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens}


def _message(c: Choice) -> dict:
    msg: dict = {"role": "assistant", "content": c.content}
    if c.tool_calls:
        msg["tool_calls"] = [t.model_dump() for t in c.tool_calls]
    return msg


async def _sse(head: dict, n: int, first: Delta | Reply, rest: AsyncIterator[Delta | Reply],
               with_usage: bool) -> AsyncIterator[str]:
    """OpenAI's `chat.completion.chunk`s of a streamed call: per choice the role, then its
    content deltas (with their logprobs when asked) as sampled; once the reply is recorded,
    each choice's tool calls and finish; with `usage`, a last chunk with no choices carrying it.
    A failure mid-stream goes out as an `error` event (what OpenAI's clients raise on)."""
    def chunk(k: int, delta: dict, logprobs: list | None = None, finish: str | None = None) -> str:
        return "data: " + json.dumps({**head, "object": "chat.completion.chunk", "choices": [
            {"index": k, "delta": delta, "finish_reason": finish,
             "logprobs": None if logprobs is None else {"content": logprobs, "refusal": None}}]}) + "\n\n"

    for k in range(n):
        yield chunk(k, {"role": "assistant", "content": ""})
    ev: Delta | Reply = first
    try:
        while isinstance(ev, Delta):
            yield chunk(ev.index, {"content": ev.content} if ev.content else {}, ev.logprobs)
            ev = await anext(rest)
    except EngineError as e:
        code = "engine_rejected" if isinstance(e, EngineRejected) else "engine_unavailable"
        yield "data: " + json.dumps({"error": {"code": code, "message": str(e), "type": code}}) + "\n\n"
        yield "data: [DONE]\n\n"
        return
    finally:
        await rest.aclose()  # a client gone mid-stream: the session's engine calls end here, not at GC
    for k, c in enumerate(ev.choices):
        for i, call in enumerate(c.tool_calls):
            yield chunk(k, {"tool_calls": [{"index": i, **call.model_dump()}]})
        yield chunk(k, {}, finish=c.finish_reason)
    if with_usage:
        yield "data: " + json.dumps({**head, "object": "chat.completion.chunk", "choices": [],
                                     "usage": _usage(ev)}) + "\n\n"
    yield "data: [DONE]\n\n"
