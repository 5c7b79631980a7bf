"""One evaluation: load a model folder into the grading service's engines, roll it out once
on every hidden test task (greedy, seeded), and score it as the mean reward.

Failure is data here too: a trajectory that failed for infrastructure reasons (engine, env,
sandbox, timeout, ...) is counted by kind and left out of the mean, never scored 0. If more
than `1 - MIN_USABLE` of the test trajectories failed, or any turn ran on other weights than
the ones just loaded, the evaluation as a whole failed (`EvaluationFailed`) and gives no score.
A folder the engines refuse to load is the submission's fault (`NotLoadable`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from benchmarks.rlbench.catalog import BenchTask
from trainer_client import AsyncRolloutClient, RolloutError, WeightUpdateError
from wire import TrajectoryState

MIN_USABLE = 0.9  # below this share of usable test trajectories a score would mislead


@dataclass(slots=True)
class Evaluation:
    score: float
    n_tasks: int
    usable: int
    truncated: int
    seconds: float
    version: int  # the policy version the submission ran as
    failures: dict[str, int] = field(default_factory=dict)


class EvaluationFailed(Exception):
    """The grading service could not score the model (its fault, not the model's)."""

    def __init__(self, message: str, failures: dict[str, int] | None = None):
        super().__init__(message)
        self.failures = failures or {}


class NotLoadable(Exception):
    """The engines refused to load the folder (wrong architecture, broken weights, ...)."""


class Evaluator(Protocol):
    async def __call__(self, model: Path) -> Evaluation: ...


class ServiceEvaluator:
    """Evaluates through a rollout service that only the grader uses."""

    def __init__(self, url: str, spec: BenchTask, tasks: list[dict[str, Any]], timeout_s: float = 3600.0,
                 deadline_s: float | None = None, tag: str = "rlbench") -> None:
        """`timeout_s` bounds a whole evaluation. `deadline_s` would bound each trajectory's active
        time, but by default there is none: max_tokens and max_turns bound a trajectory's work, and
        on a slow engine every test task is in flight at once, so a per-trajectory deadline fails
        them for the machine's speed, not the model's (measured: 29 of 64 on a busy 2-core CPU)."""
        self.url, self.spec, self.tasks, self.tag = url, spec, tasks, tag
        self.timeout_s, self.deadline_s = timeout_s, deadline_s

    async def __call__(self, model: Path) -> Evaluation:
        t0 = time.monotonic()
        batch_id = None
        async with AsyncRolloutClient(self.url, timeout=60.0) as c:
            try:
                async with asyncio.timeout(self.timeout_s):
                    try:
                        version = (await c.update_weights(path=str(model))).version
                    except WeightUpdateError as e:
                        raise NotLoadable(f"the grader's engine could not load {model}: {e}") from e
                    batch = await c.submit(self.tasks, env=self.spec.env, group_size=1, sampling=self.spec.sampling(),
                                           max_turns=self.spec.max_turns, deadline_s=self.deadline_s,
                                           metadata={"rlbench": self.tag, "model": str(model)[-200:]})
                    batch_id = batch.id
                    await c.wait(batch.id, poll_s=0.2)
                    trajs = [t async for t in c.trajectories(batch.id)]
            except TimeoutError:
                if batch_id is not None:
                    await _cancel(c, batch_id)
                raise EvaluationFailed(f"the evaluation took over {self.timeout_s:.0f} s") from None
            except RolloutError as e:
                raise EvaluationFailed(f"the grading service failed: {e}") from e
        return score(trajs, version, time.monotonic() - t0)


def score(trajs: list, version: int, seconds: float) -> Evaluation:
    """The mean reward of the usable trajectories, with failure counts; raises EvaluationFailed."""
    failures = Counter(t.failure.kind.value for t in trajs if t.failure is not None)
    usable = [t for t in trajs if t.usable]
    stale = sum(turn.policy_version != version for t in usable for turn in t.turns)
    if stale:
        raise EvaluationFailed(f"{stale} turns ran on other weights than version {version}", dict(failures))
    if not trajs or len(usable) < MIN_USABLE * len(trajs):
        raise EvaluationFailed(f"only {len(usable)} of {len(trajs)} test trajectories are usable", dict(failures))
    mean = math.fsum(t.reward or 0.0 for t in usable) / len(usable)
    truncated = sum(t.state is TrajectoryState.truncated for t in trajs)
    return Evaluation(round(mean, 6), len(trajs), len(usable), truncated, seconds, version, dict(failures))


async def _cancel(c: AsyncRolloutClient, batch_id: str) -> None:
    with contextlib.suppress(RolloutError):  # best effort: the service is the grader's and stops with it
        await c.cancel(batch_id)
