"""Engine kinds: which client speaks to a registered engine. A plug point: `EngineInfo.kind`
names a row of `KINDS`, and the fleet and the weight updater build engines through
`make_engine` only.

    vllm    `VLLMEngine`: vLLM's OpenAI-compatible server (and the simulated engine's, which
            serves the same slice of it)

A new kind is a module with a class that has the `Engine` protocol's methods (`generate`,
`prefill`, `health`, `load_weights`, `aclose`) and a `from_info(EngineInfo)` constructor,
plus one line here (see docs/ARCHITECTURE.md, "Plug points").
"""

from __future__ import annotations

from collections.abc import Callable

from rollout_service.engines.base import Engine
from rollout_service.engines.vllm import VLLMEngine
from wire import EngineInfo

KINDS: dict[str, Callable[[EngineInfo], Engine]] = {
    "vllm": VLLMEngine.from_info,
}


def make_engine(info: EngineInfo) -> Engine:
    try:
        make = KINDS[info.kind]
    except KeyError:
        raise ValueError(f"no engine kind {info.kind!r}; known: {', '.join(KINDS)}") from None
    return make(info)
