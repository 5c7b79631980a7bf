"""What every wire family shares: the two model bases, strict integers, request bounds, and
the chat `Message` (an env's observation, a trajectory's transcript, a judge's prompt).

Non-goal: behaviour. These are shapes; nothing here does I/O or imports our other packages.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import to_jsonable_python

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


def finite(v: Any) -> Any:
    """Free-form JSON whose numbers are all finite. JSON has no NaN or Infinity, yet Python's
    parser reads `NaN`, `Infinity` and `1e400` (as infinity): a task carrying one was queued,
    failed each attempt as the service's own fault (its env call could not be encoded), and read
    back with null in its place. NumPy values (`{"seed": np.random.randint(9)}` is an `int64`, which
    no JSON encoder takes) become the Python values they hold. One pass, ~1 µs a small task."""
    stack, arrays = [v], False
    while stack:
        x = stack.pop()
        t = type(x)
        if t is str or t is int or t is bool or x is None:
            continue
        if t is float or isinstance(x, float):  # (NumPy's float64 is a float)
            if not math.isfinite(x):
                raise ValueError(f"{_where(v, x)} is {x}: JSON has no NaN or Infinity (send a string or null)")
        elif t is dict:
            stack.extend(x.values())
        elif t is list or t is tuple:
            stack.extend(x)
        elif hasattr(x, "dtype") and hasattr(x, "tolist"):  # a NumPy (or torch) scalar or array
            arrays = True
    return finite(json.loads(json.dumps(v, default=_plain))) if arrays else v


def _plain(o: Any) -> Any:
    return o.tolist() if hasattr(o, "dtype") and hasattr(o, "tolist") else to_jsonable_python(o)


def _where(v: Any, bad: float, path: str = "$") -> str | None:
    """The path of the first number in `v` that is `bad` (NaN is not equal to itself)."""
    if isinstance(v, float) and (v == bad or v != v and bad != bad):
        return path
    items = v.items() if type(v) is dict else enumerate(v) if type(v) in (list, tuple) else ()
    for k, x in items:
        got = _where(x, bad, f"{path}.{k}" if type(v) is dict else f"{path}[{k}]")
        if got is not None:
            return got
    return None if path != "$" else "a number"


# A JSON object as callers send it (a task, a tool's parameter schema): any shape, finite numbers.
JsonObject = Annotated[dict[str, Any], AfterValidator(finite)]


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
