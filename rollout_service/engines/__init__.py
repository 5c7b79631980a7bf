"""Engines: where tokens come from. `base` holds the protocol; `vllm` speaks vLLM's
OpenAI-compatible HTTP API; `sim` is a deterministic simulated engine with a cost model."""

from rollout_service.engines.base import Engine, EngineError, GenerateRequest, GenerateResult

__all__ = ["Engine", "EngineError", "GenerateRequest", "GenerateResult"]
