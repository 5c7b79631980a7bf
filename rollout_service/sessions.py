"""OpenAI-compatible sessions: any agent harness becomes a source of exact trajectories.

An agent we do not control talks to `/v1/sessions/{id}/chat/completions` with any OpenAI
client. Each call is one turn: the proxy renders the messages with the engine's chat
template, calls an engine with token ids, and records the prompt delta, the sampled ids and
their logprobs. When the agent sends back the previous reply unchanged followed by new
messages, the prompt is built by appending (the sampled ids are reused exactly, never
re-tokenized); when it rewrites history, the call starts a new training sample (segment).

Unlike a batch, the agent drives the loop, so these engine calls run in the gateway.
Non-goals: streaming responses and tool-call (function) formats.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass

import redis.asyncio as aioredis

from rollout_service.engines.base import GenerateRequest
from rollout_service.engines.fleet import Fleet
from rollout_service.tokens import ChatTokens, TemplateDriftError, chat_tokens
from rollout_service.turns import record_turn
from scheduler.keys import Keys
from wire import (
    ChatCompletionRequest,
    Message,
    SamplingParams,
    SessionCreate,
    Trajectory,
    TrajectoryState,
)


class SessionNotFound(KeyError):
    pass


class SessionClosed(ValueError):
    pass


@dataclass(slots=True)
class Reply:
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


class Sessions:
    def __init__(self, redis: aioredis.Redis, keys: Keys, fleet: Fleet, ttl_s: int = 7 * 86400):
        self.r, self.k, self.fleet, self.ttl_s = redis, keys, fleet, ttl_s
        self._locks: dict[str, asyncio.Lock] = {}

    async def create(self, tenant: str, body: SessionCreate) -> Trajectory:
        sid = f"s-{uuid.uuid4().hex[:16]}"
        traj = Trajectory(id=sid, batch_id="session", group_index=0, sample_index=0, env="proxy",
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
        """One chat completion, recorded as a turn of the session's trajectory."""
        async with self._lock(sid):
            traj = await self.get(sid, tenant)
            if traj.state is not TrajectoryState.running:
                raise SessionClosed(f"session {sid} is {traj.state.value}")
            spec, tok = await self.fleet.tokenizer_for(sid)
            chat = chat_tokens(tok)
            messages = [Message(role=m.role, content=m.content) for m in req.messages]
            delta, segment, context = self._prompt(traj, chat, messages)
            sampling = SamplingParams(temperature=req.temperature, top_p=req.top_p, max_tokens=req.limit,
                                      seed=req.seed, stop=req.stop_list())
            t0 = time.monotonic()
            res = await self.fleet.generate(sid, spec, GenerateRequest(context + delta, sampling,
                                                                       f"{sid}-{len(traj.turns)}", [tok.eos_id]))
            _, text = record_turn(traj, delta, res, tok, segment, time.monotonic() - t0)
            traj.messages = [*messages, Message(role="assistant", content=text)]
            await self._save(traj)
            return Reply(text, res.finish_reason, len(context) + len(delta), len(res.output_ids))

    @staticmethod
    def _prompt(traj: Trajectory, chat: ChatTokens, messages: list[Message]) -> tuple[list[int], int, list[int]]:
        """(delta, segment, context): append when the agent extends the last exchange."""
        if not traj.turns:
            return chat.prompt(messages), 0, []
        last = traj.turns[-1]
        seg = [t for t in traj.turns if t.segment == last.segment]
        context = [i for t in seg for i in (*t.prompt_ids, *t.output_ids)]
        n = len(traj.messages)
        if messages[:n] == traj.messages and len(messages) > n:
            try:
                return chat.continuation(last.output_ids, messages[n:]), last.segment, context
            except TemplateDriftError:
                pass
        return chat.prompt(messages), last.segment + 1, []
