"""Wire types: everything that crosses HTTP, and nothing else.

Pydantic lives here and only here. Inside the service the same data travels as these
models (they are the stored form in Redis too), so a trajectory read back by a trainer is
byte-for-byte what the worker recorded.

Example:
    >>> req = RolloutRequest(tasks=[{"question": "2+2?", "answer": 4}], env="math", group_size=2)
    >>> req.num_trajectories
    2
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from typing import Annotated

import httpx
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

# Bounds on what one request may ask for (invariant: nothing unbounded). The gateway adds the
# ones a deployment tunes: tasks × group_size, bytes per task and per request, open trajectories
# per tenant (`Settings`, enforced in `rollout_service.limits`).
MAX_GROUP_SIZE = 256
MAX_TURNS = 256
MAX_TOKENS_PER_TURN = 32_768


def _integral(v: Any) -> Any:
    # JSON Schema's "integer" includes 3.0; strict mode alone would refuse it.
    return int(v) if isinstance(v, float) and v.is_integer() and abs(v) < 2**63 else v


Int = Annotated[int, BeforeValidator(_integral)]
Seed = Annotated[int, Field(ge=0, le=2**32 - 1), BeforeValidator(_integral)]
Version = Annotated[int, Field(ge=0), BeforeValidator(_integral)]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Input(_Wire):
    """What callers send: strict, so `"1"`, `1.0` or `0` never pass for an int or a bool."""

    model_config = ConfigDict(extra="forbid", strict=True)


class TrajectoryState(str, Enum):
    queued = "queued"
    running = "running"
    completed = "completed"
    truncated = "truncated"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset(
    {TrajectoryState.completed, TrajectoryState.truncated, TrajectoryState.failed, TrajectoryState.cancelled}
)


class BatchState(str, Enum):
    queued = "queued"
    running = "running"
    completed = "completed"
    cancelled = "cancelled"


class FailureKind(str, Enum):
    engine = "engine"
    env = "env"
    sandbox = "sandbox"
    timeout = "timeout"
    cancelled = "cancelled"
    internal = "internal"
    rejected = "rejected"  # the environment refused the task (or an action) as invalid: bad input, never retried

    @property
    def infrastructure(self) -> bool:
        """True when our infrastructure failed (the failure says nothing about the policy: mask
        it out of the loss). Cancelled is the caller's choice and rejected the task's own fault."""
        return self not in (FailureKind.cancelled, FailureKind.rejected)


class SamplingParams(_Input):
    temperature: float = Field(1.0, ge=0.0, le=10.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: Int = Field(-1, ge=-1)
    max_tokens: Int = Field(256, ge=1, le=MAX_TOKENS_PER_TURN)
    seed: Seed | None = None
    stop: list[str] = Field(default_factory=list, max_length=16)


class RolloutRequest(_Input):
    """A batch: every task is rolled out `group_size` times (one GRPO group per task)."""

    tasks: list[dict[str, Any]] = Field(min_length=1)
    env: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    group_size: Int = Field(1, ge=1, le=MAX_GROUP_SIZE)
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    max_turns: Int = Field(8, ge=1, le=MAX_TURNS)
    max_total_tokens: Int = Field(8192, ge=16, le=1_000_000, description="Prompt + sampled tokens per trajectory.")
    deadline_s: Annotated[float, Field(gt=0, le=86_400)] | None = Field(
        None, description="Active-time limit per trajectory (generation and tool time, not time queued).")
    idempotency_key: str | None = Field(None, min_length=1, max_length=200)
    model: str | None = Field(None, max_length=200, description="Served model name; None means any engine.")
    metadata: dict[str, str] = Field(default_factory=dict, max_length=32)
    context: Literal["append", "rerender"] = Field(
        "append", description="append: each prompt extends the last (one training sample). rerender: each prompt is "
                              "the chat template applied to the whole conversation; where that rewrites an earlier "
                              "prefix, the trajectory splits into another training sample.")

    @property
    def num_trajectories(self) -> int:
        return len(self.tasks) * self.group_size


class Message(_Wire):
    role: Literal["system", "user", "assistant", "tool"]
    content: str


class TurnTimings(_Wire):
    queue_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    tool_s: float = 0.0


class Turn(_Wire):
    """One engine call. `prompt_ids` are the tokens appended before it (the whole rendered
    prompt on turn 0; closing + observation + generation prompt afterwards), so that the
    concatenation over turns of `prompt_ids + output_ids` is exactly the token sequence the
    engine saw and sampled."""

    index: int
    prompt_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    finish_reason: str
    policy_version: int
    engine_id: str
    timings: TurnTimings = Field(default_factory=TurnTimings)
    reward: float = 0.0
    segment: int = Field(0, description="Training sample this turn belongs to (see RolloutRequest.context).")
    tool_failure: str | None = Field(None, description="The env's tool call after this turn failed: timeout, crash, "
                                                        "... (the model saw it as text; the episode went on).")


class Sample(_Wire):
    """Tokens for the loss: exactly what the engine saw and sampled, 1 in the mask where sampled."""

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]


class Failure(_Wire):
    kind: FailureKind
    message: str

    @property
    def maskable(self) -> bool:
        return self.kind.infrastructure


class Trajectory(_Wire):
    id: str
    batch_id: str
    group_index: int
    sample_index: int
    env: str
    task: dict[str, Any]
    state: TrajectoryState
    turns: list[Turn] = Field(default_factory=list)
    messages: list[Message] = Field(default_factory=list, description="The conversation as text, for humans.")
    reward: float | None = None
    failure: Failure | None = None
    attempts: int = Field(0, description="Attempts charged to this trajectory (the one that ended it included).")
    restarts: int = Field(0, description="Times our infrastructure lost and restarted its episode (never charged).")
    active_s: float = 0.0
    info: dict[str, Any] = Field(default_factory=dict)

    # Flat training views. Computed, not stored: turns are the one source of truth.
    def samples(self) -> list["Sample"]:
        """One training sample per segment (a single one unless a template rewrote a prefix)."""
        out: dict[int, Sample] = {}
        for turn in self.turns:
            s = out.setdefault(turn.segment, Sample(token_ids=[], loss_mask=[], logprobs=[]))
            s.token_ids += [*turn.prompt_ids, *turn.output_ids]
            s.loss_mask += [0] * len(turn.prompt_ids) + [1] * len(turn.output_ids)
            s.logprobs += [0.0] * len(turn.prompt_ids) + list(turn.output_logprobs)
        return [out[k] for k in sorted(out)]

    def _single(self) -> "Sample":
        samples = self.samples()
        if len(samples) > 1:
            raise ValueError(f"trajectory {self.id} has {len(samples)} training samples; use .samples()")
        return samples[0] if samples else Sample(token_ids=[], loss_mask=[], logprobs=[])

    @property
    def token_ids(self) -> list[int]:
        return self._single().token_ids

    @property
    def loss_mask(self) -> list[int]:
        return self._single().loss_mask

    @property
    def logprobs(self) -> list[float]:
        """Per-token logprobs aligned with `token_ids`; 0.0 where the loss mask is 0."""
        return self._single().logprobs

    @property
    def policy_versions(self) -> list[int]:
        return [turn.policy_version for turn in self.turns]

    @property
    def usable(self) -> bool:
        """True when this trajectory should enter the loss (not an infrastructure failure)."""
        return self.state in (TrajectoryState.completed, TrajectoryState.truncated)


class BatchCreated(_Wire):
    id: str
    num_trajectories: int
    created: bool = Field(description="False when an earlier batch with this idempotency key was returned.")


class BatchStatus(_Wire):
    id: str
    state: BatchState
    env: str
    num_trajectories: int
    counts: dict[TrajectoryState, int]
    created_at: float
    finished_at: float | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    tenant: str = "default"

    @property
    def done(self) -> int:
        return sum(n for s, n in self.counts.items() if s.terminal)


class GroupStatus(_Wire):
    """A GRPO group (one task's trajectories): how many are done and how many are usable."""

    group_index: int
    size: int
    done: int
    usable: int = Field(description="completed or truncated: fit for the loss")
    failed: int
    rewards: list[float | None] = Field(description="per member, in sample order; None until usable")


class TrajectoryPage(_Wire):
    items: list[Trajectory]
    next_cursor: int | None


class TrajectoryEvent(_Wire):
    """One server-sent event: a trajectory reached a terminal state."""

    trajectory_id: str
    state: TrajectoryState
    reward: float | None
    failure: Failure | None = None
    seq: int


class EngineInfo(_Input):
    id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")
    url: str = Field(min_length=8, max_length=512, pattern=r"^https?://[A-Za-z0-9._\[\]-]+(:[0-9]{1,5})?(/[!-~]*)?$")
    model: str = Field("default", max_length=200)

    @field_validator("url")
    @classmethod
    def _parsable(cls, v: str) -> str:
        try:
            host = httpx.URL(v).host
        except (httpx.InvalidURL, ValueError) as e:
            raise ValueError(f"not a usable URL: {e}") from None
        if not host:
            raise ValueError("URL needs a host")
        return v
    policy_version: Int = Field(0, ge=0)
    tokenizer: str = Field("byte", max_length=512, description="'byte' or a local tokenizer folder.")
    role: Literal["prefill", "decode", "mixed", "draining"] = Field(
        "mixed", description="Prefill/decode role (PD allocation); draining engines get no new work.")


class EngineRoleUpdate(_Input):
    role: Literal["prefill", "decode", "mixed"]


class WorkerInfo(_Input):
    id: str = Field(min_length=1, max_length=128)
    url: str = Field(min_length=1, max_length=512)
    envs: list[str]


class ApiKeyCreate(_Input):
    tenant: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    admin: bool = False


class ApiKeyCreated(_Wire):
    key: str = Field(description="Shown once; only its hash is stored.")
    tenant: str
    admin: bool


class ErrorBody(_Wire):
    code: str
    message: str
    details: Any = None


class ErrorResponse(_Wire):
    """The one error shape every endpoint answers with."""

    error: ErrorBody


# --- env worker wire (rollout worker <-> env worker) ---

class EnvOpen(_Input):
    env: str = Field(min_length=1, max_length=64)
    task: dict[str, Any]
    seed: Int | None = None


class EnvOpened(_Wire):
    session_id: str
    observation: list[Message]
    info: dict[str, Any] = Field(default_factory=dict)


class EnvAction(_Input):
    action: str = Field(max_length=1_000_000)


class EnvStepped(_Wire):
    observation: list[Message]
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any] = Field(default_factory=dict)


# --- weights (trainer -> engines) ---

class WeightUpdate(_Input):
    """Push new weights: a full checkpoint folder, or (with `lora_name`) a LoRA adapter folder."""

    path: str = Field(min_length=1, max_length=1024, description="Folder readable by the engines.")
    lora_name: str | None = Field(None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:-]+$",
                                  description="Load `path` as this LoRA adapter; requests then name it.")
    version: Version | None = Field(None, description="Default: highest current version + 1.")
    engines: list[str] | None = Field(None, description="Default: every registered engine.")


class EngineUpdateResult(_Wire):
    engine_id: str
    ok: bool
    seconds: float
    error: str | None = None


class WeightUpdateResult(_Wire):
    """Partial failure is data: `ok` is False if any engine failed (it keeps its old version)."""

    ok: bool
    version: int
    results: list[EngineUpdateResult]


# --- OpenAI-compatible session proxy ---

class SessionCreate(_Input):
    metadata: dict[str, str] = Field(default_factory=dict, max_length=32)


class SessionCreated(_Wire):
    id: str
    base_url_path: str = Field(description="Give an OpenAI client base_url = gateway URL + this path.")


class SessionFinish(_Input):
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
