"""A batch's recording: what `rollout export` writes and `rollout replay` reads.

One JSONL file, self-contained (nothing else is needed to replay or re-simulate it):

    line 1    RecordingHeader       format, version, the batch's status and its whole request
    line 2…   RecordedTrajectory    one per trajectory, in submission order

A `RecordedTrajectory` is the stored `Trajectory` unchanged (every turn's prompt and sampled
ids, logprobs, policy version, engine, timings — queue, prefill, decode, tool — and reward; the
failure, if any) plus what a replay needs spelled out: the seed the environment was reset
with, each turn's sampling seed, and the episode as the environment saw it (the opening
observation, then per turn the action handed to `step` and what `step` returned).

Readers refuse another `format` and a `version` newer than theirs.

Example:
    >>> RecordingHeader.model_fields["version"].default == VERSION
    True
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from wire.base import Message, Wire
from wire.batches import BatchStatus, RolloutRequest, Trajectory

FORMAT = "rollout-recording"
VERSION = 1


class RecordingHeader(Wire):
    format: Literal["rollout-recording"] = FORMAT
    version: int = VERSION
    batch: BatchStatus
    request: RolloutRequest
    exported_at: float = Field(description="Unix time of the export.")


class RecordedStep(Wire):
    """One turn as the environment saw it."""

    turn: int
    sampling_seed: int | None = Field(description="The seed the engine sampled this turn with (None: unseeded).")
    action: str = Field(description="The reply text handed to `env.step` (decoded from the sampled ids).")
    observation: list[Message] | None = Field(
        description="What `step` returned; None when it never returned (the episode failed in this step).")
    reward: float
    done: bool = Field(description="The environment ended the episode at this step (terminated or truncated).")


class RecordedTrajectory(Wire):
    env_seed: int
    opening: list[Message] = Field(description="What `env.reset` returned.")
    steps: list[RecordedStep]
    trajectory: Trajectory
    replayable: str | None = Field(None, description="Why this trajectory cannot be replayed (None: it can).")
