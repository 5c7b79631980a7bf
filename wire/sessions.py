"""The gateway's OpenAI-compatible session proxy: an agent we do not drive, recorded turn by turn."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from wire.base import MAX_TOKENS_PER_TURN, Input, Message, ToolCall, Wire

MAX_CHOICES = 16  # n: samples per call (a GRPO group from one call)


class SessionCreate(Input):
    metadata: dict[str, str] = Field(default_factory=dict, max_length=32)


class SessionCreated(Wire):
    id: str
    base_url_path: str = Field(description="Give an OpenAI client base_url = gateway URL + this path.")


class SessionFinish(Input):
    reward: float | None = Field(None, allow_inf_nan=False)


def _unsupported(field: str, why: str = "") -> PydanticCustomError:
    return PydanticCustomError("unsupported", "{field} is not supported by the session proxy{why}",
                               {"field": field, "why": why})


class ChatMessageIn(BaseModel):
    """One message as OpenAI clients send it. Text content only: a string, a list of text parts
    (joined with newlines, as vLLM does), or null (an assistant message that only calls tools)."""

    model_config = ConfigDict(extra="ignore")  # clients send name, refusal, annotations, ...: ignored

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | None = Field(None, max_length=1_000_000)
    tool_calls: list[ToolCall] | None = Field(None, max_length=64)
    tool_call_id: str | None = Field(None, max_length=200)

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts(cls, v: Any) -> Any:
        if not isinstance(v, list):
            return v
        texts = []
        for part in v:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text" or not isinstance(part.get("text"), str):
                raise _unsupported(f"content part of type {kind!r}", " (text parts only)")
            texts.append(part["text"])
        return "\n".join(texts)

    def to_message(self) -> Message:
        role = "system" if self.role == "developer" else self.role
        return Message(role=role, content=self.content or "", tool_calls=self.tool_calls or None,
                       tool_call_id=self.tool_call_id)


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="ignore")  # strict, ...: ignored

    name: str = Field(min_length=1, max_length=200)
    description: str | None = Field(None, max_length=100_000)
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class ToolDef(BaseModel):
    type: Literal["function"]
    function: FunctionDef


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")  # include_obfuscation: nothing to obfuscate

    include_usage: bool = False


# OpenAI request fields that would change what is sampled and that the proxy cannot honour:
# each is refused (422 naming it) unless absent or at its neutral value. Fields that change
# nothing sampled (user, metadata, store, service_tier, prompt_cache_key, ...) are ignored.
UNSUPPORTED: dict[str, tuple] = {
    "frequency_penalty": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "response_format": (None, {"type": "text"}),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "web_search_options": (None,),
    "functions": (None,),
    "function_call": (None,),
    "reasoning_effort": (None,),
    "verbosity": (None,),
    "best_of": (None, 1),
}


class ChatCompletionRequest(BaseModel):
    """The part of OpenAI's chat completion request the proxy honours (README, "Any agent").
    Unknown fields are ignored (clients send many); a field it knows and cannot honour
    (`UNSUPPORTED`) is refused with a 422 that names it."""

    model_config = ConfigDict(extra="allow")  # kept, so that `UNSUPPORTED` fields can be named

    model: str = Field("default", max_length=200)
    messages: list[ChatMessageIn] = Field(min_length=1, max_length=10_000)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1, description="vLLM's extension: -1 means off")
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_PER_TURN)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_PER_TURN)
    seed: int | None = Field(None, ge=0, le=2**32 - 1)
    stop: str | list[str] | None = Field(None, description="at most 16 strings")
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[ToolDef] | None = Field(None, max_length=128)
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None  # several calls in one reply are always parsed

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > 16:
            raise ValueError("at most 16 stop strings")
        return v

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, v: str | dict | None) -> str | None:
        if v in (None, "auto", "none"):
            return v
        # "required" or a named function would need constrained decoding to be honoured.
        raise _unsupported("tool_choice", f" with value {v!r} (only 'auto' and 'none')")

    @model_validator(mode="after")
    def _refuse_unsupported(self) -> ChatCompletionRequest:
        for name, value in (self.model_extra or {}).items():
            if name in UNSUPPORTED and value not in UNSUPPORTED[name]:
                raise _unsupported(name)
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def limit(self) -> int:
        return self.max_completion_tokens or self.max_tokens or 256

    @property
    def tool_specs(self) -> list[dict] | None:
        """The tools as plain JSON (what chat templates take), or None when calls are off."""
        if not self.tools or self.tool_choice == "none":
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools]
