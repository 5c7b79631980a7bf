"""The gateway's OpenAI-compatible session proxy: an agent we do not drive, recorded turn by turn."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from wire.base import MAX_TOKENS_PER_TURN, Input, Wire


class SessionCreate(Input):
    metadata: dict[str, str] = Field(default_factory=dict, max_length=32)


class SessionCreated(Wire):
    id: str
    base_url_path: str = Field(description="Give an OpenAI client base_url = gateway URL + this path.")


class SessionFinish(Input):
    reward: float | None = Field(None, allow_inf_nan=False)


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="ignore")  # clients send name, tool_call_id, ...: ignored

    role: Literal["system", "user", "assistant", "tool"]
    content: str = Field(max_length=1_000_000)


class ChatCompletionRequest(BaseModel):
    """The subset of OpenAI's chat completion request the proxy honours. Unknown fields are
    ignored (clients send many); features it cannot honour are refused with 422."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field("default", max_length=200)
    messages: list[ChatMessageIn] = Field(min_length=1, max_length=10_000)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_PER_TURN)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_PER_TURN)
    seed: int | None = Field(None, ge=0, le=2**32 - 1)
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=1, description="one choice per call")
    stream: Literal[False] = Field(False, description="streaming is not supported")
    tools: None = Field(None, description="tool (function) calling is not supported; put tools in the prompt")

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])[:16]

    @property
    def limit(self) -> int:
        return self.max_completion_tokens or self.max_tokens or 256
