"""The environment protocol (Gymnasium's shape, with chat messages as observations).

    obs, info = env.reset(task, seed)          # obs: the opening messages (system, user)
    obs, reward, terminated, truncated, info = env.step(action_text)

An environment is synchronous and owns one episode; the env worker runs it in a thread.
A tool error goes back to the model as text in the observation (and its kind in
`StepResult.info["tool_failure"]`); `EnvError` from `reset`/`step` means the task or action
was unusable, `EnvUnavailable` an infrastructure failure of kind `env`, and its subclass
`SandboxUnavailable` one of kind `sandbox`.

Environments that use tools take `resources=` (a `env_workers.resources.Claims`, one per
episode) and acquire sandboxes through it only when the model first calls a tool.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from wire import Message


@dataclass(slots=True)
class StepResult:
    observation: list[Message]
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any] = field(default_factory=dict)


class Env(Protocol):
    def reset(self, task: dict[str, Any], seed: int | None = None) -> tuple[list[Message], dict[str, Any]]: ...

    def step(self, action: str) -> StepResult: ...

    def close(self) -> None: ...


class EnvError(Exception):
    """Raised by an environment that cannot continue (bad task payload, broken state)."""


class EnvUnavailable(Exception):
    """The env worker, or something an environment depends on, failed; retryable elsewhere."""


class SandboxUnavailable(EnvUnavailable):
    """No sandbox could be had (pool exhausted after its bounded wait, start failed) or the
    sandbox broke under the episode: an infrastructure failure of kind `sandbox`."""


def checked_step(r: StepResult) -> StepResult:
    """A step's result as the protocol has it: a reward that is a finite number. A NaN reached
    the trajectory's reward in this process, and went over HTTP as null (then failed to parse,
    blamed on us); either way the environment's reward code failed: EnvUnavailable, kind `env`."""
    if not isinstance(r.reward, int | float) or not math.isfinite(r.reward):
        raise EnvUnavailable(f"the environment returned a reward of {r.reward!r}, not a finite number")
    return r
