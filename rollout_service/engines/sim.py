"""A simulated engine: deterministic given a seed, with a cost model for prefill and decode.

It speaks the byte tokenizer (`rollout_service.tokens.ByteTokenizer`) and answers with a
toy policy that reads the last user message and guesses an arithmetic answer, sometimes
calling the `calc:` tool first. That makes rewards vary across a GRPO group without a model.
Time is simulated by sleeping `cost * time_scale` (0 in tests: instant).

Non-goals: being a language model; modelling KV-cache memory (see benchmarks/sim for that).
"""

from __future__ import annotations

import asyncio
import hashlib
import operator
import random
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from rollout_service.engines.base import GenerateRequest, GenerateResult, TokenDelta
from rollout_service.engines.capabilities import Capabilities, from_kv_config
from rollout_service.tokens import ByteTokenizer
from rollout_service.turns import first_stop


@dataclass(slots=True)
class CostModel:
    """Seconds for prefill and decode. Defaults are an assumed GPU-class engine serving a
    small model; the CPU figures measured here live in benchmarks/ (they are ~100x slower)."""

    prefill_tokens_per_s: float = 20_000.0
    prefill_overhead_s: float = 0.004
    decode_step_s: float = 0.010  # one decode step at batch size 1
    decode_step_per_seq_s: float = 0.0001  # each concurrent sequence slows the step a little
    kv_transfer_tokens_per_s: float = 200_000.0  # prefill -> decode KV hand-over (assumed, RDMA-class link)
    kv_transfer_overhead_s: float = 0.002

    def prefill_time(self, prompt_tokens: int) -> float:
        return self.prefill_overhead_s + prompt_tokens / self.prefill_tokens_per_s

    def transfer_time(self, tokens: int) -> float:
        return self.kv_transfer_overhead_s + tokens / self.kv_transfer_tokens_per_s

    def decode_time(self, new_tokens: int, batch: int) -> float:
        return new_tokens * (self.decode_step_s + self.decode_step_per_seq_s * max(batch - 1, 0))


_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
_INT = re.compile(r"-?\d+")
_LAST_USER = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S)


def toy_policy(prompt_text: str, rng: random.Random) -> str:
    """Guess an answer from the numbers in the last user message; use `calc:` when offered."""
    users = _LAST_USER.findall(prompt_text)
    last = users[-1] if users else prompt_text
    result = re.search(r"result:\s*(-?\d+)", last)
    thought = " ".join(rng.choice(["hmm", "so", "then", "ok", "let", "me", "think"]) for _ in range(rng.randint(2, 12)))
    if result:
        return f"{thought}. answer: {result.group(1)}"
    nums = [int(n) for n in _INT.findall(last)][:3] or [rng.randint(0, 9), rng.randint(0, 9)]
    a, b = (nums + nums)[:2]
    op = rng.choice(list(_OPS))
    if "calc:" in prompt_text and rng.random() < 0.6:
        return f"{thought}. calc: {a} {op} {b}"
    return f"{thought}. answer: {_OPS[op](a, b)}"


def scripted(replies: list[str]):
    """A policy that answers the k-th assistant turn of a conversation with `replies[k]` (the
    last one from then on): deterministic replies, tool calls included, for tests and examples.

        SimEngine(policy=scripted(['<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>',
                                   "The sum is 3."]))
    """
    def policy(prompt_text: str, rng: random.Random) -> str:
        k = prompt_text.count("<|im_start|>assistant") - 1  # the generation prompt is the last one
        return replies[min(max(k, 0), len(replies) - 1)]
    return policy


class SimEngine:
    """In-process simulated engine. Concurrency-aware: decode slows with more sequences."""

    def __init__(self, id: str = "sim-0", seed: int = 0, cost: CostModel | None = None,
                 time_scale: float = 0.0, policy_version: int = 0, policy=toy_policy):
        """`policy(prompt_text, rng) -> response text` stands in for the model."""
        self.id = id
        self.seed = seed
        self.cost = cost or CostModel()
        self.time_scale = time_scale
        self.policy_version = policy_version
        self.tok = ByteTokenizer()
        self.policy = policy
        self._running = 0
        self.created_at = time.time()

    def _rng(self, req: GenerateRequest) -> random.Random:
        # Same seed + same prompt + same request seed -> same output, across processes.
        h = hashlib.sha256(f"{self.seed}|{req.sampling.seed}|{req.request_id if req.sampling.seed is None else ''}".encode())
        h.update(bytes(str(req.prompt_ids), "ascii"))
        return random.Random(h.digest())

    def sample(self, req: GenerateRequest) -> tuple[list[int], list[float], str, list[list[tuple[int, float]]] | None]:
        """(ids, logprobs, finish, top_logprobs): the policy's text, stopped as an engine would
        (on a stop string, the eos, or `max_tokens`, whichever comes first)."""
        rng = self._rng(req)
        text = self.policy(self.tok.decode(req.prompt_ids), rng)
        ids = [*self.tok.encode(text), self.tok.eos_id]
        hit = first_stop(text, req.sampling.stop)
        if hit is not None:  # one byte per token: the token completing the stop string is the last
            ids = ids[: len(text[: hit[1]].encode("utf-8"))]
        finish = "stop"
        if len(ids) > req.sampling.max_tokens:
            ids, finish = ids[: req.sampling.max_tokens], "length"
        scale = max(req.sampling.temperature, 0.05)
        logprobs = [-rng.expovariate(4.0 / scale) for _ in ids]
        top = None
        if req.top_logprobs:  # the sampled id first, then made-up runners-up, less likely
            top = [[(i, lp), *(((i + j) % 256, lp - j) for j in range(1, req.top_logprobs))]
                   for i, lp in zip(ids, logprobs)]
        return ids, logprobs, finish, top

    async def prefill(self, req: GenerateRequest) -> dict:
        """Model a prefill kept for another engine: returns what a decode engine needs."""
        t = self.cost.prefill_time(len(req.prompt_ids))
        if self.time_scale > 0:
            await asyncio.sleep(t * self.time_scale)
        return {"do_remote_prefill": True, "remote_engine_id": self.id, "remote_num_tokens": len(req.prompt_ids)}

    def _prefill_s(self, req: GenerateRequest) -> float:
        remote = (req.kv_transfer_params or {}).get("remote_num_tokens")
        # With KV handed over, the decode engine pays the transfer instead of the prefill.
        return self.cost.transfer_time(remote) if remote else self.cost.prefill_time(len(req.prompt_ids))

    async def generate(self, req: GenerateRequest) -> GenerateResult:
        ids, logprobs, finish, top = self.sample(req)
        self._running += 1
        try:
            prefill = self._prefill_s(req)
            decode = self.cost.decode_time(len(ids), self._running)
            if self.time_scale > 0:
                await asyncio.sleep((prefill + decode) * self.time_scale)
        finally:
            self._running -= 1
        return GenerateResult(ids, logprobs, finish, self.policy_version, self.id, prefill, decode, top_logprobs=top)

    async def stream(self, req: GenerateRequest) -> AsyncIterator[TokenDelta | GenerateResult]:
        """`generate`'s sample, one token per decode step (the cost model's time each)."""
        ids, logprobs, finish, top = self.sample(req)
        self._running += 1
        try:
            prefill, decode = self._prefill_s(req), 0.0
            if self.time_scale > 0:
                await asyncio.sleep(prefill * self.time_scale)
            for j, (i, lp) in enumerate(zip(ids, logprobs)):
                step = self.cost.decode_time(1, self._running)
                decode += step
                if self.time_scale > 0:
                    await asyncio.sleep(step * self.time_scale)
                yield TokenDelta([i], [lp], None if top is None else [top[j]])
        finally:
            self._running -= 1
        yield GenerateResult(ids, logprobs, finish, self.policy_version, self.id, prefill, decode, top_logprobs=top)

    async def health(self) -> bool:
        return True

    async def started_at(self) -> float | None:
        """When this engine was made: "weights" (a seed) last as long as the object."""
        return self.created_at

    async def capabilities(self) -> Capabilities:
        return from_kv_config({"kv_connector": "SimulatedConnector", "kv_role": "kv_both"})

    async def update_weights(self, path: str, lora_name: str | None, loaded) -> None:
        """New "weights" reseed the simulated policy (as `sim_server` does over HTTP)."""
        self.seed = int.from_bytes(hashlib.sha256(f"{lora_name}:{path}".encode()).digest()[:4], "little")
        await loaded()

    async def aclose(self) -> None:
        return None
