"""What every wire family shares: the two model bases, strict integers, request bounds, and
the chat `Message` (an env's observation, a trajectory's transcript, a judge's prompt).

Non-goal: behaviour. These are shapes; nothing here does I/O or imports our other packages.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

# Bounds on what one request may ask for (invariant: nothing unbounded). The gateway adds the
# ones a deployment tunes: tasks × group_size, bytes per task and per request, open trajectories
# per tenant (`Settings`, enforced in `rollout_service.limits`).
MAX_GROUP_SIZE = 256
MAX_TURNS = 256
MAX_TOKENS_PER_TURN = 32_768
# An environment's name: `math`, or FAMILY:NAME for a third-party one, where NAME may be a
# Gymnasium id (`pkg.module:Name-v0`) or a server URL (`openenv:http://127.0.0.1:8000`).
ENV_NAME_MAX = 256
ENV_NAME_PATTERN = r"^[A-Za-z0-9_.-]+(:[A-Za-z0-9_./:@%+=-]+)?$"


def integral(v: Any) -> Any:
    # JSON Schema's "integer" includes 3.0; strict mode alone would refuse it.
    return int(v) if isinstance(v, float) and v.is_integer() and abs(v) < 2**63 else v


Int = Annotated[int, BeforeValidator(integral)]
Seed = Annotated[int, Field(ge=0, le=2**32 - 1), BeforeValidator(integral)]
TurnTokens = Annotated[int, Field(ge=1, le=MAX_TOKENS_PER_TURN), BeforeValidator(integral)]  # tokens one turn may sample
Version = Annotated[int, Field(ge=0), BeforeValidator(integral)]


class Wire(BaseModel):
    """What we send: unknown fields are an error (a typo never passes silently)."""

    model_config = ConfigDict(extra="forbid")


class Input(Wire):
    """What callers send: strict, so `"1"`, `1.0` or `0` never pass for an int or a bool."""

    model_config = ConfigDict(extra="forbid", strict=True)


class FunctionCall(Wire):
    name: str = Field(max_length=200)
    arguments: str = Field(max_length=1_000_000, description="JSON text, exactly as the model wrote it.")


class ToolCall(Wire):
    """A function call an assistant message makes (OpenAI's shape)."""

    id: str = Field(max_length=200)
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(Wire):
    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: list[ToolCall] | None = Field(None, description="assistant: the function calls it made")
    tool_call_id: str | None = Field(None, max_length=200, description="tool: the call this message answers")
