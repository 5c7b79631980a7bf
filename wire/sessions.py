"""The gateway's OpenAI-compatible session proxy: an agent we do not drive, recorded turn by turn."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, field_validator, model_validator
from pydantic_core import PydanticCustomError

from wire.base import MAX_GROUP_SIZE, Input, Int, JsonObject, Message, Seed, ToolCall, TurnTokens, Wire, integral

MAX_CHOICES = 16  # n: samples per call (a GRPO group from one call)
StopText = Annotated[str, Field(min_length=1)]  # an empty stop string is refused (vLLM answers 400)

# The OpenAI-shaped models below are strict, as `Input` is: a request that breaks the documented
# schema (`true` or `"3"` for an integer, `1` for a boolean) is a 422, never coerced into a sample.
# Unknown fields are ignored (clients send many), so they are not `Input`s.


class SessionCreate(Input):
    metadata: dict[str, str] = Field(default_factory=dict, max_length=32)
    group: str = Field("session", min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$",
                       description="The trajectory's batch_id: sessions of one group form a GRPO group "
                                   "(trainer_client.grpo groups by batch_id and group_index).")
    sample_index: Int = Field(0, ge=0, le=MAX_GROUP_SIZE, description="This session's place in its group.")


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

    model_config = ConfigDict(extra="ignore", strict=True)  # clients send name, refusal, annotations, ...: ignored

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


def _auto_or_none(v: Any) -> Any:
    if v in (None, "auto", "none"):
        return v
    # "required" or a named function would need constrained decoding to be honoured.
    raise _unsupported("tool_choice", f" with value {v!r} (only 'auto' and 'none')")


ToolChoice = Annotated[Literal["auto", "none"] | None, BeforeValidator(_auto_or_none)]


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)  # OpenAI's own `strict` flag, ...: ignored

    name: str = Field(min_length=1, max_length=200)
    description: str | None = Field(None, max_length=100_000)
    parameters: JsonObject = Field(default_factory=lambda: {"type": "object", "properties": {}})


class ToolDef(BaseModel):
    model_config = ConfigDict(strict=True)

    type: Literal["function"]
    function: FunctionDef


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)  # include_obfuscation: nothing to obfuscate

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

    model_config = ConfigDict(extra="allow", strict=True)  # kept, so that `UNSUPPORTED` fields can be named

    model: str = Field("default", max_length=200)
    messages: list[ChatMessageIn] = Field(min_length=1, max_length=10_000)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: Int = Field(-1, ge=-1, description="vLLM's extension: -1 means off")
    max_tokens: TurnTokens | None = None
    max_completion_tokens: TurnTokens | None = None
    seed: Seed | None = None
    stop: StopText | Annotated[list[StopText], Field(max_length=16)] | None = None
    n: Int = Field(1, ge=1, le=MAX_CHOICES)
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20), BeforeValidator(integral)] | None = None
    tools: list[ToolDef] | None = Field(None, max_length=128)
    tool_choice: ToolChoice = None
    parallel_tool_calls: bool | None = None  # several calls in one reply are always parsed

    @model_validator(mode="after")
    def _refuse_unsupported(self) -> ChatCompletionRequest:
        for name, value in (self.model_extra or {}).items():
            if name in UNSUPPORTED and value not in UNSUPPORTED[name]:
                raise _unsupported(name)
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


# Responses API fields the proxy cannot honour (besides those of chat completions): refused
# unless absent or neutral. `previous_response_id` and `conversation` need stored responses:
# send the whole input each time (what `store: false` clients do).
RESPONSES_UNSUPPORTED: dict[str, tuple] = {
    "previous_response_id": (None,),
    "conversation": (None,),
    "background": (None, False),
    "reasoning": (None, {}),
    "prompt": (None,),
    "stream": (None, False),
    "text": (None, {"format": {"type": "text"}}),
    "top_logprobs": (None, 0),
}


def _text(content: Any) -> Any:
    """Responses content parts (`input_text`, `output_text`) as one text, newline-joined."""
    if not isinstance(content, list):
        return content
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text") or not isinstance(part.get("text"), str):
            raise _unsupported(f"content part of type {kind!r}", " (text parts only)")
        texts.append(part["text"])
    return "\n".join(texts)


Text = Annotated[str, BeforeValidator(_text), Field(max_length=1_000_000)]


class MessageItem(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)  # id, status: ignored

    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: Text


class FunctionCallItem(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    type: Literal["function_call"]
    call_id: str = Field(max_length=200)
    name: str = Field(max_length=200)
    arguments: str = Field(max_length=1_000_000)


class FunctionCallOutputItem(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    type: Literal["function_call_output"]
    call_id: str = Field(max_length=200)
    output: Text


def _known_items(v: Any) -> Any:
    if not isinstance(v, list):
        return v
    out = []
    for item in v:
        if isinstance(item, dict):
            item = {"type": "message", **item}
            if item["type"] not in ("message", "function_call", "function_call_output"):
                raise _unsupported(f"input item of type {item['type']!r}", " (messages and function calls only)")
        out.append(item)
    return out


Item = Annotated[MessageItem | FunctionCallItem | FunctionCallOutputItem, Field(discriminator="type")]


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)  # OpenAI's own `strict` flag: ignored

    type: Literal["function"]
    name: str = Field(min_length=1, max_length=200)
    description: str | None = Field(None, max_length=100_000)
    parameters: JsonObject | None = None


def _function_tools(v: Any) -> Any:
    for t in v if isinstance(v, list) else []:
        if isinstance(t, dict) and t.get("type") != "function":
            raise _unsupported(f"tool of type {t.get('type')!r}", " (function tools only)")
    return v


class ResponsesRequest(BaseModel):
    """OpenAI's Responses API request, for text and function calls: turned into the chat
    completion it means (`chat`), so it is served and recorded the same way."""

    model_config = ConfigDict(extra="allow", strict=True)  # kept, so that unsupported fields can be named

    model: str = Field("default", max_length=200)
    input: str | Annotated[list[Item], BeforeValidator(_known_items), Field(min_length=1, max_length=10_000)]
    instructions: str | None = Field(None, max_length=1_000_000)
    tools: Annotated[list[FunctionTool], BeforeValidator(_function_tools), Field(max_length=128)] | None = None
    tool_choice: ToolChoice = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_output_tokens: TurnTokens | None = None
    parallel_tool_calls: bool | None = None
    _chat: ChatCompletionRequest | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _refuse_unsupported(self) -> ResponsesRequest:
        for name, value in (self.model_extra or {}).items():
            if (name in RESPONSES_UNSUPPORTED and value not in RESPONSES_UNSUPPORTED[name]) or (
                    name in UNSUPPORTED and value not in UNSUPPORTED[name]):
                raise _unsupported(name)
        self._chat = self._to_chat()
        return self

    @property
    def chat(self) -> ChatCompletionRequest:
        """The same request as a chat completion (built, and so checked, on validation)."""
        return self._chat

    def _to_chat(self) -> ChatCompletionRequest:
        """Items become messages (a function call joins the assistant message before it, as
        chat completions hold them); flat function tools become nested ones."""
        messages: list[dict] = [{"role": "system", "content": self.instructions}] if self.instructions else []
        items = [MessageItem(role="user", content=self.input)] if isinstance(self.input, str) else self.input
        for item in items:
            if isinstance(item, MessageItem):
                messages.append({"role": item.role, "content": item.content})
            elif isinstance(item, FunctionCallItem):
                call = {"id": item.call_id, "type": "function",
                        "function": {"name": item.name, "arguments": item.arguments}}
                if not messages or messages[-1]["role"] != "assistant":
                    messages.append({"role": "assistant", "content": None})
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
        tools = [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                 for t in self.tools or []]
        return ChatCompletionRequest.model_validate({
            "model": self.model, "messages": messages, "tools": tools or None, "tool_choice": self.tool_choice,
            "temperature": self.temperature, "top_p": self.top_p, "max_completion_tokens": self.max_output_tokens})
