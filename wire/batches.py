"""Batches and trajectories: what a trainer submits, what it reads back.

Every state is a `str` Enum that carries its own rule: `TrajectoryState.terminal` (the episode
is over) and `TrajectoryState.usable` (it may enter the loss). The server, the SDK and the
board (through `GET /v1/states`) read these two and nothing else.

Example:
    >>> req = RolloutRequest(tasks=[{"question": "2+2?", "answer": 4}], env="math", group_size=2)
    >>> req.num_trajectories
    2
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import Field

from wire.base import ENV_NAME_MAX, ENV_NAME_PATTERN, MAX_GROUP_SIZE, MAX_TOKENS_PER_TURN, MAX_TURNS, Input, Int, JsonObject, Message, Seed, Wire


class TrajectoryState(str, Enum):
    queued = "queued"
    running = "running"
    completed = "completed"
    truncated = "truncated"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def terminal(self) -> bool:
        """The episode is over: this state never changes again."""
        return self in TERMINAL_STATES

    @property
    def usable(self) -> bool:
        """Fit for the loss: the episode ended on its own terms (the env or a limit ended it)."""
        return self in USABLE_STATES


TERMINAL_STATES = frozenset(
    {TrajectoryState.completed, TrajectoryState.truncated, TrajectoryState.failed, TrajectoryState.cancelled}
)
USABLE_STATES = frozenset({TrajectoryState.completed, TrajectoryState.truncated})


class BatchState(str, Enum):
    queued = "queued"
    running = "running"
    completed = "completed"
    cancelled = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (BatchState.completed, BatchState.cancelled)


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

    @property
    def retryable(self) -> bool:
        """Worth another attempt (charged, within `max_attempts`): an infrastructure failure,
        except a deadline that ran out, which would run out again."""
        return self.infrastructure and self is not FailureKind.timeout


class SamplingParams(Input):
    temperature: float = Field(1.0, ge=0.0, le=10.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: Int = Field(-1, ge=-1)
    max_tokens: Int = Field(256, ge=1, le=MAX_TOKENS_PER_TURN)
    seed: Seed | None = None
    stop: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list, max_length=16)  # vLLM refuses ""


class RolloutRequest(Input):
    """A batch: every task is rolled out `group_size` times (one GRPO group per task)."""

    tasks: list[JsonObject] = Field(min_length=1)
    env: str = Field(min_length=1, max_length=ENV_NAME_MAX, pattern=ENV_NAME_PATTERN,
                     description="A built-in environment (`math`) or FAMILY:NAME for a third-party one "
                                 "(`reasoning_gym:leg_counting`, `gymnasium:ID`, `openenv:URL`, ...).")
    group_size: Int = Field(1, ge=1, le=MAX_GROUP_SIZE)
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    max_turns: Int = Field(8, ge=1, le=MAX_TURNS)
    max_total_tokens: Int = Field(8192, ge=16, le=1_000_000, description="Prompt + sampled tokens per trajectory.")
    deadline_s: Annotated[float, Field(gt=0, le=86_400)] | None = Field(
        None, description="Active-time limit per trajectory (generation and tool time, not time queued).")
    idempotency_key: str | None = Field(None, min_length=1, max_length=200)
    priority: Int = Field(0, ge=-100, le=100, description="Among this tenant's batches, higher runs first (then the "
                                                          "longest expected, or the oldest). Other tenants' fair "
                                                          "share is unaffected.")
    model: str | None = Field(None, max_length=200, description="Served model name; None means any engine.")
    metadata: dict[str, str] = Field(default_factory=dict, max_length=32)
    context: Literal["append", "rerender"] = Field(
        "append", description="append: each prompt extends the last (one training sample). rerender: each prompt is "
                              "the chat template applied to the whole conversation; where that rewrites an earlier "
                              "prefix, the trajectory splits into another training sample.")

    @property
    def num_trajectories(self) -> int:
        return len(self.tasks) * self.group_size


class TurnTimings(Wire):
    queue_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    tool_s: float = 0.0


class Turn(Wire):
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
                                                        "... (the model saw it as text; the episode went on). In a "
                                                        "session: the tool call the model wrote could not be parsed.")


class Sample(Wire):
    """Tokens for the loss: exactly what the engine saw and sampled, 1 in the mask where sampled."""

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]


class Failure(Wire):
    kind: FailureKind
    message: str


class Trajectory(Wire):
    id: str
    batch_id: str
    group_index: int
    sample_index: int
    env: str
    task: dict[str, Any]
    state: TrajectoryState
    turns: list[Turn] = Field(default_factory=list, description=(
        "Every turn once terminal. While running: the turns the current attempt finished so far (each "
        "recorded as its env step returns); a requeued trajectory reruns from no turns."))
    messages: list[Message] = Field(default_factory=list, description="The conversation as text, for humans.")
    reward: float | None = None
    failure: Failure | None = None
    attempts: int = Field(0, description="Attempts charged to this trajectory (the one that ended it included).")
    restarts: int = Field(0, description="Times our infrastructure lost and restarted its episode (never charged).")
    active_s: float = 0.0
    info: dict[str, Any] = Field(default_factory=dict)
    training_samples: list[Sample] | None = Field(
        None, description="The flat training view, one sample per segment (token_ids, loss_mask, logprobs, "
                          "aligned): present only when asked for (`?samples=true`); computed from `turns`, never "
                          "stored. Python clients have it as `samples()`, `token_ids`, `loss_mask`, `logprobs`.")

    # Flat training views. Computed, not stored: turns are the one source of truth.
    def samples(self) -> list[Sample]:
        """One training sample per segment (a single one unless a template rewrote a prefix)."""
        if self.training_samples is not None:
            return self.training_samples
        out: dict[int, Sample] = {}
        for turn in self.turns:
            s = out.setdefault(turn.segment, Sample(token_ids=[], loss_mask=[], logprobs=[]))
            s.token_ids += [*turn.prompt_ids, *turn.output_ids]
            s.loss_mask += [0] * len(turn.prompt_ids) + [1] * len(turn.output_ids)
            s.logprobs += [0.0] * len(turn.prompt_ids) + list(turn.output_logprobs)
        return [out[k] for k in sorted(out)]

    def _single(self) -> Sample:
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
        """True when this trajectory should enter the loss (see `TrajectoryState.usable`)."""
        return self.state.usable

    def with_samples(self) -> "Trajectory":
        """A copy carrying `training_samples` (for the wire; what is stored never does)."""
        return self.model_copy(update={"training_samples": self.samples()})


class BatchCreated(Wire):
    id: str
    num_trajectories: int
    created: bool = Field(description="False when an earlier batch with this idempotency key was returned.")


class BatchTotals(Wire):
    """What a batch's finished trajectories add up to, kept as they finish (no trajectory read)."""

    turns: int = Field(description="turns of every finished trajectory")
    turned: int = Field(description="finished trajectories with at least one turn")
    sampled_tokens: int
    prompt_tokens: int = Field(description="tokens the trajectories' turns added to their contexts (not sampled)")
    rewarded: int = Field(description="finished trajectories with a reward")
    mean_reward: float | None = Field(description="over the rewarded ones; None while none is")
    failures: dict[str, int] = Field(description="failed or cancelled trajectories by failure kind")


class BatchStatus(Wire):
    id: str
    state: BatchState
    env: str
    num_trajectories: int
    counts: dict[TrajectoryState, int]
    created_at: float
    finished_at: float | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    tenant: str = "default"
    totals: BatchTotals | None = Field(None, description="None for a batch queued before totals were kept")

    @property
    def done(self) -> int:
        return sum(n for s, n in self.counts.items() if s.terminal)


class GroupStatus(Wire):
    """A GRPO group (one task's trajectories): how many are done and how many are usable."""

    group_index: int
    size: int
    done: int
    usable: int = Field(description="completed or truncated: fit for the loss")
    failed: int
    rewards: list[float | None] = Field(description="per member, in sample order; None until usable")


class TrajectoryPage(Wire):
    items: list[Trajectory]
    next_cursor: int | None


class TrajectoryEvent(Wire):
    """One server-sent event: a trajectory reached a terminal state."""

    trajectory_id: str
    state: TrajectoryState
    reward: float | None
    failure: Failure | None = None
    seq: int


class StateRules(Wire):
    """`GET /v1/states`: which trajectory states are terminal and which usable (the board reads
    these instead of keeping its own copy)."""

    states: list[TrajectoryState]
    terminal: list[TrajectoryState]
    usable: list[TrajectoryState]

    @classmethod
    def current(cls) -> StateRules:
        return cls(states=list(TrajectoryState), terminal=[s for s in TrajectoryState if s.terminal],
                   usable=[s for s in TrajectoryState if s.usable])
