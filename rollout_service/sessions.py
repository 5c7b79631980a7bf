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

Unlike a batch, the agent drives the loop, so these engine calls run in the gateway.
Non-goals: the HTTP shapes (routes/sessions.py); streaming from the engine token by token
(the reply is sampled whole, then streamed).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from dataclasses import dataclass

import redis.asyncio as aioredis

from rollout_service.engines.base import EngineError, GenerateRequest, GenerateResult
from rollout_service.engines.fleet import Fleet
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
    pieces: list[str]  # the content split per sampled token (a closing eos left out), for streaming


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
            top = (req.top_logprobs or 0) if req.logprobs else 0
            rid = f"{sid}-{len(traj.turns)}"

            async def sample(k: int) -> tuple[GenerateResult, float]:
                # Choice k > 0: its own request (and seed), so that the n samples differ.
                s = sampling if k == 0 or req.seed is None else sampling.model_copy(
                    update={"seed": (req.seed + k) % 2**32})
                t0 = time.monotonic()
                res = await self.fleet.generate(sid, spec, GenerateRequest(
                    context + delta, s, rid if k == 0 else f"{rid}-{k}", [tok.eos_id], top))
                return res, time.monotonic() - t0

            results = await asyncio.gather(*(sample(k) for k in range(req.n)))
            seg_next = max([segment, *(t.segment for t in traj.turns)]) + 1
            choices: list[Choice] = [None] * req.n  # type: ignore[list-item]
            for k in [*range(1, req.n), 0]:  # choice 0 last: the turn the session goes on from
                res, elapsed = results[k]
                if k == 0:
                    seg, prompt = segment, delta
                else:
                    seg, prompt, seg_next = seg_next, context + delta, seg_next + 1
                choices[k] = self._record(traj, tok, parser, req, tools, prompt, seg, res, elapsed)
            c0 = choices[0]
            traj.messages = [*messages, Message(role="assistant", content=c0.content or "",
                                                tool_calls=c0.tool_calls or None)]
            traj.info["tools_sha"] = _tools_sha(tools)
            await self._save(traj)
            return Reply(choices, len(context) + len(delta), sum(len(c.output_ids) for c in choices))

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
                      _logprobs(tok, res, req.top_logprobs or 0) if req.logprobs else None,
                      _pieces(tok, res.output_ids, content or ""))

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


def _pieces(tok: Tokenizer, ids: list[int], content: str, most: int = 4096) -> list[str]:
    """`content` cut where each sampled token ends (a closing eos left out): the deltas of a
    stream. Tokens past the content (a tool call, a stop string) get ""; a token that ends
    inside a character gets "" and the next one the whole character. Past `most` tokens
    (decoding every prefix is quadratic), the content goes in one piece."""
    n = len(ids) - (1 if ids and ids[-1] == tok.eos_id else 0)
    if n == 0 or n > most:
        return [content] if n else []
    out, sent = [], 0
    for j in range(n):
        text = tok.decode(ids[: j + 1])
        upto = min(len(text.rstrip("\ufffd")), len(content))
        if content[:upto] != text[:upto]:  # the content is not a prefix of the text (stripped around calls)
            upto = sent
        out.append(content[sent:max(upto, sent)])
        sent = max(upto, sent)
    out[-1] += content[sent:]
    return out


def _tools_sha(tools: list[dict] | None) -> str:
    return hashlib.sha256(json.dumps(tools, sort_keys=True).encode()).hexdigest()[:16] if tools else ""


def _logprobs(tok: Tokenizer, res: GenerateResult, k: int) -> list[dict]:
    """OpenAI's `logprobs.content` from the engine's values: one entry per sampled token (a
    closing eos left out, as from the text), with its `k` best alternatives."""
    n = len(res.output_ids) - (1 if res.output_ids and res.output_ids[-1] == tok.eos_id else 0)

    def entry(i: int, lp: float) -> dict:
        text = tok.decode([i])
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

    tops = res.top_logprobs or [[] for _ in res.output_ids]
    return [{**entry(i, lp), "top_logprobs": [entry(a, alp) for a, alp in tops[j][:k]] if k else []}
            for j, (i, lp) in enumerate(zip(res.output_ids[:n], res.logprobs[:n]))]
