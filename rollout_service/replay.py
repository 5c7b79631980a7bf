"""Replay a recording (`wire.recording`): re-run each episode's environment with the recorded
model outputs in place of the engine, or re-score the recorded trajectories.

    pools = Pools(REPLAY_POOL)
    verdict = replay(record, pools)        # Verdict(outcome="match" | "mismatch" | "skipped", turn, detail)
    new = rescore(records, load_scorer("my_rewards:strict"))

`replay` does what an env worker does for one session: `registry.make(env, resources=
pools.claims(owner))` (so sandboxed environments run in their sandboxes), `reset(task, seed)`
with the recorded seed, then `step(action)` with each turn's recorded action, and compares what
comes back — the opening observation, then per turn the observation, the reward and whether
the episode ended — with the recording. The first difference is the verdict; its turn is
`None` when the opening differs. No engine and no model are involved.

Which environments reproduce their recordings is stated where they are registered
(`EnvSpec.nondeterminism`: None, or why not); `tests/rollout_service/test_replay.py` checks
each claim.

Non-goal: the model side (re-sampling the ids needs an engine with the same weights).
"""

from __future__ import annotations

import importlib
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from env_workers import registry
from env_workers.env import EnvError, EnvUnavailable
from env_workers.resources import Pools, PoolSize
from wire import FailureKind, Message, Trajectory
from wire.recording import RecordedTrajectory

# Replays run one episode at a time: a few sandboxes, none kept warm; a tool call waits at
# most 30 s for one, as on an env worker.
REPLAY_POOL = PoolSize(warm=0, cap=4, wait_s=30.0)


@dataclass(slots=True)
class Verdict:
    trajectory_id: str
    env: str
    outcome: str  # match | mismatch | skipped
    turn: int | None = None  # the first turn that differs (None: the opening observation, or no difference)
    detail: str = ""


def _first_difference(got: list[Message], want: list[Message]) -> str:
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            return f"message {i}: replayed {_short(g)}, recorded {_short(w)}"
    return f"replayed {len(got)} messages, recorded {len(want)}"


def _short(m: Message, n: int = 80) -> str:
    text = m.content if len(m.content) <= n else m.content[:n] + "…"
    return f"{m.role}: {text!r}"


def replay(rec: RecordedTrajectory, pools: Pools) -> Verdict:
    traj = rec.trajectory
    v = Verdict(traj.id, traj.env, "match")

    def differ(turn: int | None, detail: str) -> Verdict:
        v.outcome, v.turn, v.detail = "mismatch", turn, detail
        return v

    if rec.replayable is not None:
        v.outcome, v.detail = "skipped", rec.replayable
        return v
    if traj.env not in registry.names():
        v.outcome, v.detail = "skipped", f"unknown environment {traj.env!r} here"
        return v
    owner = f"replay-{traj.id}"
    env = registry.make(traj.env, resources=pools.claims(owner))
    try:
        try:
            opening, _ = env.reset(traj.task, seed=rec.env_seed)
        except (EnvError, EnvUnavailable) as e:
            return differ(None, f"reset raised {e!r}")
        if opening != rec.opening:
            return differ(None, "opening observation: " + _first_difference(opening, rec.opening))
        for st in rec.steps:
            try:
                r = env.step(st.action)
            except (EnvError, EnvUnavailable) as e:
                if st.observation is None:
                    v.detail = f"turn {st.turn} failed as recorded ({traj.failure.kind.value if traj.failure else '?'})"
                    return v
                return differ(st.turn, f"step raised {e!r}; the recording went on")
            if st.observation is None:
                why = traj.failure
                if why is not None and why.kind is FailureKind.rejected:  # the env refused the action: so must it now
                    return differ(st.turn, f"step returned; the recording was rejected here: {why.message[:200]}")
                # Cancelled, a deadline, an infrastructure failure: the recording ends inside this step.
                kind = why.kind.value if why else "cancelled"
                v.detail = f"matches up to turn {st.turn}, where the recording ended ({kind})"
                return v
            if r.observation != st.observation:
                return differ(st.turn, "observation: " + _first_difference(r.observation, st.observation))
            if r.reward != st.reward:
                return differ(st.turn, f"reward: replayed {r.reward}, recorded {st.reward}")
            if (r.terminated or r.truncated) != st.done:
                return differ(st.turn, f"end of episode: replayed {r.terminated or r.truncated}, recorded {st.done}")
        v.detail = f"{len(rec.steps)} turns"
        return v
    finally:
        try:
            env.close()
        finally:
            pools.release(owner)


def load_scorer(spec: str) -> Callable[[Trajectory], float]:
    """`MODULE:FUNC` (the current folder is importable): a function from a recorded
    `wire.Trajectory` (task, messages, turns) to a reward."""
    mod, sep, name = spec.partition(":")
    if not sep or not mod or not name:
        raise ValueError(f"--score wants MODULE:FUNC, got {spec!r}")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        fn = getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"cannot load {spec!r}: {e}") from None
    if not callable(fn):
        raise ValueError(f"{spec!r} is not a function")
    return fn


@dataclass(slots=True)
class Rescored:
    trajectory_id: str
    group_index: int
    recorded: float | None
    new: float


def rescore(records: list[RecordedTrajectory], fn: Callable[[Trajectory], float]) -> list[Rescored]:
    """The new reward of every usable trajectory (failed ones carry no reward to compare)."""
    out = []
    for rec in records:
        t = rec.trajectory
        if t.usable:
            out.append(Rescored(t.id, t.group_index, t.reward, float(fn(t))))
    return out


def sign_flips(rows: list[Rescored]) -> int:
    """Trajectories whose GRPO advantage (reward minus its group's mean) changes sign."""
    groups: dict[int, list[Rescored]] = {}
    for r in rows:
        groups.setdefault(r.group_index, []).append(r)
    flips = 0
    for members in groups.values():
        old = statistics.fmean(r.recorded or 0.0 for r in members)
        new = statistics.fmean(r.new for r in members)
        flips += sum(_sign((r.recorded or 0.0) - old) != _sign(r.new - new) for r in members)
    return flips


def _sign(x: float) -> int:
    return (x > 1e-12) - (x < -1e-12)
