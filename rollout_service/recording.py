"""Write and read a batch's recording (the format is `wire.recording`).

    with open("b.jsonl", "w") as f:
        write(f, status, request, trajectories)          # what `rollout export` does
    header, records = read(Path("b.jsonl"))               # what `rollout replay` does

`record` splits a trajectory's transcript back into environment calls: its last N assistant
messages (N turns) are the turns' actions, the messages before the first of them what `reset`
returned, and the messages after each, up to the next, what `step` returned. The seeds are
recomputed by the functions the rollout loop itself uses (`rollout.env_seed`, `turn_seed`).

Non-goal: the trainer's view (`Trajectory.samples()` is already in each record).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

from pydantic import ValidationError

from rollout_service.rollout import env_seed, turn_seed
from wire import BatchStatus, RolloutRequest, Trajectory, TrajectoryState
from wire.recording import FORMAT, VERSION, RecordedStep, RecordedTrajectory, RecordingHeader


class RecordingError(Exception):
    """The file is not a recording this version can read (the message says where and why)."""


def record(traj: Trajectory, request: RolloutRequest) -> RecordedTrajectory:
    base = request.sampling.seed
    # The last len(turns) assistant messages are the turns' actions (an opening may hold
    # few-shot assistant messages; an observation never does).
    starts = [i for i, m in enumerate(traj.messages) if m.role == "assistant"][-len(traj.turns):] if traj.turns else []
    rec = RecordedTrajectory(env_seed=env_seed(traj.sample_index), opening=traj.messages[: starts[0] if starts else
                             len(traj.messages)], steps=[], trajectory=traj)
    if len(starts) != len(traj.turns):
        rec.replayable = (f"{len(traj.turns)} turns but {len(starts)} assistant messages: the transcript "
                          f"cannot be split into environment calls")
        return rec
    ends = [*starts[1:], len(traj.messages)]
    for turn, start, end in zip(traj.turns, starts, ends):
        observation = traj.messages[start + 1: end]
        last = turn.index == len(traj.turns) - 1
        failed_here = last and not traj.state.usable and not observation  # failed or cancelled inside the step
        done = last and (traj.state is TrajectoryState.completed
                         or (traj.state is TrajectoryState.truncated and traj.info.get("truncated_by") == "env"))
        rec.steps.append(RecordedStep(
            turn=turn.index, sampling_seed=turn_seed(base, traj.group_index, traj.sample_index, turn.index),
            action=traj.messages[start].content, observation=None if failed_here else observation,
            reward=turn.reward, done=done))
    if not traj.messages:
        rec.replayable = "no transcript: the episode never opened"
    return rec


def write(out: TextIO, status: BatchStatus, request: RolloutRequest, trajectories: Iterable[Trajectory]) -> int:
    """Write the header and one line per trajectory; returns the number of trajectories."""
    out.write(RecordingHeader(batch=status, request=request, exported_at=time.time()).model_dump_json() + "\n")
    n = 0
    for traj in trajectories:
        out.write(record(traj, request).model_dump_json() + "\n")
        n += 1
    return n


def read(path: Path) -> tuple[RecordingHeader, list[RecordedTrajectory]]:
    if not path.exists():
        raise RecordingError(f"no such file: {path}")
    lines = [(n, ln) for n, ln in enumerate(path.read_text().splitlines(), 1) if ln.strip()]
    if not lines:
        raise RecordingError(f"{path} is empty")
    try:
        first = json.loads(lines[0][1])
    except json.JSONDecodeError as e:
        raise RecordingError(f"{path}:1: not JSON: {e}") from None
    if not isinstance(first, dict) or first.get("format") != FORMAT:
        raise RecordingError(f"{path}: not a {FORMAT} file (no header line with format {FORMAT!r})")
    if not isinstance(first.get("version"), int) or first["version"] > VERSION:
        raise RecordingError(f"{path}: format version {first.get('version')!r}; this reader knows up to {VERSION}")
    try:
        header = RecordingHeader.model_validate(first)
        records = [RecordedTrajectory.model_validate_json(ln) for _, ln in lines[1:]]
    except ValidationError as e:
        raise RecordingError(f"{path}: not a valid recording: {e}") from None
    return header, records
