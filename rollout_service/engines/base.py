"""The `Engine` protocol: token ids in, sampled token ids + logprobs out (whole, or streamed
as they are sampled)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from rollout_service.engines.capabilities import Capabilities
from wire import SamplingParams


class EngineError(Exception):
    """The engine could not serve a request (unreachable, 5xx, malformed answer)."""


class EngineRejected(EngineError):
    """The engine refused this request as invalid (HTTP 400 or 422: a stop string it does not take,
    more tokens than its context holds): the engine is fine and asking again, there or elsewhere,
    gets the same answer. Not retried, and the engine stays in rotation (it was marked down, so
    one bad request took it from every other trajectory until the next health probe)."""


class ContextFull(EngineRejected):
    """The prompt leaves no room in the engine's context (its `max_model_len`) for one more
    token: the trajectory has run out of context, which ends it as truncated, not failed."""


def refused(engine_id: str, status: int, text: str) -> EngineError:
    """The error for an engine's non-200 answer: EngineRejected for 400 and 422."""
    kind = EngineRejected if status in (400, 422) else EngineError
    return kind(f"engine {engine_id} answered {status}: {text[:300]}")


class EngineLost(EngineError):
    """No engine could be reached at all (connection refused, reset, timed out): the engine
    process is gone or restarting. Our fault, not the trajectory's: the worker restarts the
    episode without charging its attempts."""


@dataclass(slots=True)
class GenerateRequest:
    prompt_ids: list[int]
    sampling: SamplingParams
    request_id: str
    stop_token_ids: list[int] = field(default_factory=list)
    top_logprobs: int = 0  # alternatives per sampled token to return (0: none)
    # Prefill/decode disaggregation: {"do_remote_decode": True} asks a prefill engine to keep
    # the KV for another engine; what it answers is passed to the decode engine.
    kv_transfer_params: dict | None = None


@dataclass(slots=True)
class GenerateResult:
    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "abort"
    policy_version: int
    engine_id: str
    prefill_s: float = 0.0
    decode_s: float = 0.0
    kv_transfer_params: dict | None = None  # from a prefill engine, for the decode engine
    # With `top_logprobs` asked: per sampled token, the engine's best (id, logprob), best first.
    top_logprobs: list[list[tuple[int, float]]] | None = None


@dataclass(slots=True)
class TokenDelta:
    """Tokens just sampled, handed on while the request runs (a streamed engine call)."""

    ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]] | None = None  # as in `GenerateResult`


class Engine(Protocol):
    id: str
    policy_version: int

    async def generate(self, req: GenerateRequest) -> GenerateResult: ...

    def stream(self, req: GenerateRequest) -> AsyncIterator[TokenDelta | GenerateResult]:
        """The same sampling as `generate`, handed on as it happens: `TokenDelta`s, then the
        whole `GenerateResult` (every id the deltas carried, in order) as the last item."""

    async def prefill(self, req: GenerateRequest) -> dict: ...

    async def health(self) -> bool: ...

    async def capabilities(self) -> Capabilities:
        """The prefill/decode roles it can serve (`engines.capabilities`)."""

    async def update_weights(self, path: str, lora_name: str | None, loaded: Callable[[], Awaitable[None]]) -> None:
        """Swap in new weights; await `loaded()` once they serve, before requests resume."""

    async def started_at(self) -> float | None:
        """When the engine's process started (Unix seconds): a later value means it restarted, with
        the weights it was launched with. None: it does not say."""

    async def aclose(self) -> None: ...
