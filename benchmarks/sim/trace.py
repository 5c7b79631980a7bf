"""A recorded batch as the simulator's workload, instead of the synthetic generators.

    wl = trace_workload(Path("batch.jsonl"), per_gpu=16, time_scale=1.0)
    Cluster(wl, 8, Policy.guided(), "async").run()

A recording (`rollout export`, format `wire.recording`) holds, per trajectory, every turn's
prompt ids, sampled ids and tool time. Each becomes an `Episode`: the opening prompt is turn
0's prompt length, each turn's response the number of sampled ids, its tool latency the
recorded `tool_s`, and its observation the next turn's prompt length (the closing, the
observation and the generation prompt the engine prefilled). Trajectories that never ran a
turn (rejected, cancelled while queued) are left out.

`time_scale` multiplies tool times and `length_scale` token counts: a recording made on a CPU
with a small model is short and fast next to the GPU cluster simulated (see
`benchmarks/pd_allocation.py --trace`). Episode i of a run is recorded episode (i + offset)
mod n, in (group, sample) order; the seed picks the offset in whole GRPO groups (unless
`offset` is set: `benchmarks/sim/fidelity.py` replays in queue order), so members of a recorded
group stay together and share their opening prompt, as in the service.

Non-goals: rewards, text, re-running environments (that is `rollout replay`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.sim.workload import Episode, TurnSpec, Workload
from rollout_service.recording import read


@dataclass(slots=True)
class TraceWorkload(Workload):
    recorded: list[Episode] = field(default_factory=list)  # in (group, sample) order
    group_of: int = 1  # the recording's group size
    offset: int | None = None  # episode 0 is recorded episode `offset`; None: drawn from the seed

    def episode(self, seed: int, index: int, progress: float) -> Episode:
        n_groups = len(self.recorded) // self.group_of
        offset = self.offset if self.offset is not None else \
            random.Random(f"{seed}:{self.name}").randrange(n_groups) * self.group_of
        src = self.recorded[(index + offset) % len(self.recorded)]
        group = f"g{index // self.group_of}" if self.group_of > 1 else None
        return Episode(f"t{index}", src.env, src.tool, src.prompt,
                       [TurnSpec(t.response, t.latency_s, t.observation) for t in src.turns], group)


def trace_workload(path: Path, per_gpu: int = 16, rounds: int = 2, time_scale: float = 1.0,
                   length_scale: float = 1.0, name: str = "trace") -> TraceWorkload:
    header, records = read(path)
    size = header.request.group_size
    episodes = []
    for rec in sorted(records, key=lambda r: (r.trajectory.group_index, r.trajectory.sample_index)):
        turns = rec.trajectory.turns
        if not turns:
            continue
        specs = [TurnSpec(max(round(len(t.output_ids) * length_scale), 1), t.timings.tool_s * time_scale,
                          max(round(len(turns[i + 1].prompt_ids) * length_scale), 1) if i + 1 < len(turns) else 1)
                 for i, t in enumerate(turns)]
        episodes.append(Episode(rec.trajectory.id, rec.trajectory.env, rec.trajectory.env,
                                max(round(len(turns[0].prompt_ids) * length_scale), 1), specs))
    if not episodes:
        raise ValueError(f"{path}: no trajectory ran a turn; nothing to simulate")
    # A group with a member left out would pair strangers: keep whole groups only, else none.
    group_of = size if size > 1 and len(episodes) == len(records) and len(episodes) % size == 0 else 1
    envs = sorted({e.env for e in episodes})
    return TraceWorkload(name, lambda _: {e: 1.0 for e in envs}, per_gpu=per_gpu, rounds=rounds, profiles={},
                         group=group_of, recorded=episodes, group_of=group_of)
