"""OpenAI-compatible sessions: any agent harness becomes a source of exact trajectories.

An agent we do not control talks to `/v1/sessions/{id}/chat/completions` with any OpenAI
client. Each call is one turn: the proxy renders the messages with the engine's chat
template, calls an engine with token ids, and records the prompt delta, the sampled ids and
their logprobs. When the agent sends back the previous reply unchanged followed by new
messages, the prompt is built by appending (the sampled ids are reused exactly, never
re-tokenized); when it rewrites history (or changes its tools), the call starts a new
training sample (segment).

Tools are rendered by the template where it can (else in the engine's tool parser's
fallback format, `toolcalls`), and the calls are parsed out of the reply's text; the turn
keeps the sampled ids whatever the parse finds, and a parse failure is the turn's
`tool_failure`. `n > 1` samples n choices of one prompt, each a turn (see `_record`).

`stream` serves the same call with the engine streaming: the content goes out as the tokens
are sampled (`streams.ReplyStream` says what may go out when), the turn is recorded as
`complete` records it, and the tool calls follow once the whole reply is parsed.

Unlike a batch, the agent drives the loop, so these engine calls run in the gateway.
Non-goals: the HTTP shapes (routes/sessions.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

import redis.asyncio as aioredis

from rollout_service.engines.base import EngineError, GenerateRequest, GenerateResult, TokenDelta
from rollout_service.engines.fleet import Fleet
from rollout_service.streams import ReplyStream, merged
from rollout_service.tokens import TemplateDriftError, Tokenizer, chat_tokens
from rollout_service.toolcalls import Parsed, ToolParser, as_plain, get_parser, read_calls
from rollout_service.turns import record_turn
from scheduler.keys import Keys
from wire import (
    ChatCompletionRequest,
    Message,
    SamplingParams,
    SessionCreate,
    ToolCall,
    Trajectory,
    TrajectoryState,
)


class SessionNotFound(KeyError):
    pass


class SessionClosed(ValueError):
    pass


@dataclass(slots=True)
class Choice:
    content: str | None
    tool_calls: list[ToolCall]
    finish_reason: str  # OpenAI's: stop | length | tool_calls
    output_ids: list[int]
    logprobs: list[dict] | None  # OpenAI's `logprobs.content`, when asked for


@dataclass(slots=True)
class Delta:
    """Part of a streamed choice: its content's next piece, the logprobs of the tokens sampled."""

    index: int
    content: str
    logprobs: list[dict] | None


@dataclass(slots=True)
class Reply:
    choices: list[Choice]
    prompt_tokens: int
    completion_tokens: int


class Sessions:
    def __init__(self, redis: aioredis.Redis, keys: Keys, fleet: Fleet, ttl_s: int = 7 * 86400):
        self.r, self.k, self.fleet, self.ttl_s = redis, keys, fleet, ttl_s
        self._locks: dict[str, asyncio.Lock] = {}

    async def create(self, tenant: str, body: SessionCreate) -> Trajectory:
        sid = f"s-{uuid.uuid4().hex[:16]}"
        traj = Trajectory(id=sid, batch_id=body.group, group_index=0, sample_index=body.sample_index, env="proxy",
                          task=dict(body.metadata), state=TrajectoryState.running)
        await self.r.hset(self.k.session(sid), mapping={"tenant": tenant, "traj": traj.model_dump_json(),
                                                        "created_at": time.time()})
        await self.r.expire(self.k.session(sid), self.ttl_s)
        return traj

    async def get(self, sid: str, tenant: str | None) -> Trajectory:
        """The session's trajectory; `tenant=None` skips the ownership check (admin)."""
        owner, raw = await self.r.hmget(self.k.session(sid), "tenant", "traj")
        if raw is None or (tenant is not None and owner.decode() != tenant):
            raise SessionNotFound(sid)
        return Trajectory.model_validate_json(raw)

    async def _save(self, traj: Trajectory) -> None:
        await self.r.hset(self.k.session(traj.id), "traj", traj.model_dump_json())

    async def finish(self, sid: str, tenant: str | None, reward: float | None) -> Trajectory:
        async with self._lock(sid):
            traj = await self.get(sid, tenant)
            traj.state, traj.reward = TrajectoryState.completed, reward
            await self._save(traj)
            return traj

    def _lock(self, sid: str) -> asyncio.Lock:
        if len(self._locks) > 10_000:  # bounded: idle locks are cheap to recreate
            self._locks = {k: v for k, v in self._locks.items() if v.locked()}
        return self._locks.setdefault(sid, asyncio.Lock())

    async def complete(self, sid: str, tenant: str | None, req: ChatCompletionRequest) -> Reply:
        """One chat completion, recorded as a turn of the session's trajectory (`n` turns for
        `n` choices: choice 0 continues the session, the others are siblings, see `_record`)."""
        async with self._lock(sid):
            call = await self._open(sid, tenant, req)

            async def sample(k: int) -> tuple[GenerateResult, float]:
                t0 = time.monotonic()
                res = await self.fleet.generate(sid, call.spec, call.request(k))
                return res, time.monotonic() - t0

            return await self._close(call, list(await asyncio.gather(*(sample(k) for k in range(req.n)))))

    async def stream(self, sid: str, tenant: str | None, req: ChatCompletionRequest) -> AsyncIterator[Delta | Reply]:
        """`complete`, handed on while the engine samples: `Delta`s of each choice's content
        (and logprobs) as its tokens come, then, once the reply is recorded (the same turns as
        `complete` records), each choice's rest of content, and the `Reply` last. An engine
        failure raises: before the first token, as from `complete`; later, mid-stream. A stream
        given up early (the client went away) records nothing: the engine requests are aborted."""
        async with self._lock(sid):
            call = await self._open(sid, tenant, req)
            stops = req.stop_list()
            texts = [ReplyStream(call.tok, stops, call.parser.start if call.tools else None) for _ in range(req.n)]
            results: list[tuple[GenerateResult, float]] = [None] * req.n  # type: ignore[list-item]
            t0 = time.monotonic()
            streams = [self.fleet.stream(sid, call.spec, call.request(k)) for k in range(req.n)]
            async with aclosing(merged(streams)) as events:  # given up early: the engine streams end now
                async for k, ev in events:
                    if isinstance(ev, GenerateResult):
                        results[k] = (ev, time.monotonic() - t0)
                        continue
                    assert isinstance(ev, TokenDelta)
                    text = texts[k].push(ev.ids)
                    lps = _logprobs(call.tok, ev.ids, ev.logprobs, ev.top_logprobs, req.top_logprobs or 0) \
                        if req.logprobs else None
                    if text or lps:
                        yield Delta(k, text, lps)
            reply = await self._close(call, results)
            for k, c in enumerate(reply.choices):
                if rest := texts[k].rest(c.content):
                    yield Delta(k, rest, None)
            yield reply

    async def _open(self, sid: str, tenant: str | None, req: ChatCompletionRequest) -> _Call:
        """What one chat completion samples from: the session's prompt so far (lock held)."""
        traj = await self.get(sid, tenant)
        if traj.state is not TrajectoryState.running:
            raise SessionClosed(f"session {sid} is {traj.state.value}")
        spec, tok, parser_name = await self.fleet.chat_for(sid)
        try:
            parser = get_parser(parser_name)
        except ValueError as e:
            raise EngineError(str(e)) from None
        messages = [m.to_message() for m in req.messages]
        tools = req.tool_specs
        delta, segment, context = self._prompt(traj, _Render(tok, parser, tools), messages)
        sampling = SamplingParams(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                                  max_tokens=req.limit, seed=req.seed, stop=req.stop_list())
        return _Call(req, traj, spec, tok, parser, tools, messages, delta, segment, context, sampling)

    async def _close(self, call: _Call, results: list[tuple[GenerateResult, float]]) -> Reply:
        """Record the n samples as turns, save the session, answer."""
        req, traj = call.req, call.traj
        seg_next = max([call.segment, *(t.segment for t in traj.turns)]) + 1
        choices: list[Choice] = [None] * req.n  # type: ignore[list-item]
        for k in [*range(1, req.n), 0]:  # choice 0 last: the turn the session goes on from
            res, elapsed = results[k]
            if k == 0:
                seg, prompt = call.segment, call.delta
            else:
                seg, prompt, seg_next = seg_next, call.context + call.delta, seg_next + 1
            choices[k] = self._record(traj, call.tok, call.parser, req, call.tools, prompt, seg, res, elapsed)
        c0 = choices[0]
        traj.messages = [*call.messages, Message(role="assistant", content=c0.content or "",
                                                 tool_calls=c0.tool_calls or None)]
        traj.info["tools_sha"] = _tools_sha(call.tools)
        await self._save(traj)
        return Reply(choices, len(call.context) + len(call.delta), sum(len(c.output_ids) for c in choices))

    @staticmethod
    def _record(traj: Trajectory, tok: Tokenizer, parser: ToolParser, req: ChatCompletionRequest,
                tools: list[dict] | None, prompt: list[int], segment: int, res: GenerateResult,
                elapsed: float) -> Choice:
        """Record one sample as a turn; read its tool calls. A sibling choice (k > 0) starts a
        segment of its own holding the whole prompt: each choice is a full training sample, and
        the n of them share the prompt (a GRPO group from one call)."""
        turn, text = record_turn(traj, prompt, res, tok, segment, elapsed, req.stop_list())
        parsed = read_calls(parser, text, tools, lambda j: f"call_{traj.id[2:]}_{turn.index}_{j}") if tools \
            else Parsed(text)
        turn.tool_failure = parsed.failure
        finish = "tool_calls" if parsed.calls else ("length" if res.finish_reason == "length" else "stop")
        content = parsed.content if parsed.content or not parsed.calls else None
        return Choice(content, parsed.calls, finish, res.output_ids,
                      _logprobs(tok, res.output_ids, res.logprobs, res.top_logprobs, req.top_logprobs or 0)
                      if req.logprobs else None)

    @staticmethod
    def _prompt(traj: Trajectory, render: _Render, messages: list[Message]) -> tuple[list[int], int, list[int]]:
        """(delta, segment, context): append when the agent extends the last exchange (same tools)."""
        if not traj.turns:
            return render.prompt(messages), 0, []
        last = traj.turns[-1]
        seg = [t for t in traj.turns if t.segment == last.segment]
        context = [i for t in seg for i in (*t.prompt_ids, *t.output_ids)]
        n = len(traj.messages)
        if (messages[:n] == traj.messages and len(messages) > n
                and traj.info.get("tools_sha", "") == _tools_sha(render.tools)):
            try:
                return render.continuation(last.output_ids, messages[n:]), last.segment, context
            except TemplateDriftError:
                pass
        return render.prompt(messages), max(t.segment for t in traj.turns) + 1, []


@dataclass(slots=True)
class _Call:
    """One chat completion being served: the request and the prompt it samples from."""

    req: ChatCompletionRequest
    traj: Trajectory
    spec: str
    tok: Tokenizer
    parser: ToolParser
    tools: list[dict] | None
    messages: list[Message]
    delta: list[int]  # the prompt ids after `context`
    segment: int
    context: list[int]  # the segment's ids so far (choice 0 appends to them)
    sampling: SamplingParams

    def request(self, k: int) -> GenerateRequest:
        """The engine request of choice k; k > 0 has its own id (and seed), so that the n differ."""
        s, seed = self.sampling, self.req.seed
        if k and seed is not None:
            s = s.model_copy(update={"seed": (seed + k) % 2**32})
        rid = f"{self.traj.id}-{len(self.traj.turns)}"
        top = (self.req.top_logprobs or 0) if self.req.logprobs else 0
        return GenerateRequest(self.context + self.delta, s, rid if k == 0 else f"{rid}-{k}", [self.tok.eos_id], top)


@dataclass(slots=True)
class _Render:
    """Messages to prompt ids: tools through the template where it renders them, else in the
    tool parser's fallback format (`toolcalls.as_plain`)."""

    tok: Tokenizer
    parser: ToolParser
    tools: list[dict] | None

    @property
    def native(self) -> bool:
        return getattr(self.tok, "supports_tools", False)

    def prompt(self, messages: list[Message]) -> list[int]:
        if self.native:
            return chat_tokens(self.tok).prompt(messages, self.tools)
        return chat_tokens(self.tok).prompt(as_plain(messages, self.tools, self.parser))

    def continuation(self, output_ids: list[int], new: list[Message]) -> list[int]:
        if self.native:
            return chat_tokens(self.tok).continuation(output_ids, new, self.tools)
        return chat_tokens(self.tok).continuation(output_ids, as_plain(new, None, self.parser))


def _tools_sha(tools: list[dict] | None) -> str:
    return hashlib.sha256(json.dumps(tools, sort_keys=True).encode()).hexdigest()[:16] if tools else ""


def _logprobs(tok: Tokenizer, ids: list[int], lps: list[float], tops: list | None, k: int) -> list[dict]:
    """OpenAI's `logprobs.content` from the engine's values: one entry per sampled token (a
    closing eos left out, as from the text), with its `k` best alternatives."""
    n = len(ids) - (1 if ids and ids[-1] == tok.eos_id else 0)

    def entry(i: int, lp: float) -> dict:
        text = tok.decode([i])
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

    tops = tops or [[] for _ in ids]
    return [{**entry(i, lp), "top_logprobs": [entry(a, alp) for a, alp in tops[j][:k]] if k else []}
            for j, (i, lp) in enumerate(zip(ids[:n], lps[:n]))]
