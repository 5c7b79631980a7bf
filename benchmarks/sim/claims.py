"""Rollout slots claiming from the real queue in simulated time: which trajectory runs when.

The queue is the real one (`scheduler.queue.Queue` on a real Redis, under its own prefix:
`enqueue`, `claim_many`, `complete`), and so is what longest-first reads: a `scheduler.
lifecycle.Lifecycle` on the simulated clock feeds a `scheduler.forecast.Forecaster`, whose
per-environment `expected_s` is published with `Queue.report_expected` as a live worker does.
Only the clock and the episodes (`workload.draw_episode`) are simulated: an episode holds one
slot for its turns' decode time (response tokens at `decode_tok_s`, one sequence's speed) plus
its tool latencies.

Non-goals: engine contention, prefill and KV (benchmarks/sim/cluster.py and
benchmarks/pd_allocation.py model those); failures and retries.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

from benchmarks.sim.workload import PROFILES, Episode, draw_episode
from scheduler.forecast import Forecaster
from scheduler.keys import batch_of
from scheduler.lifecycle import Lifecycle
from scheduler.queue import Queue
from wire import RolloutRequest, Trajectory, TrajectoryState


@dataclass(slots=True)
class StepResult:
    makespan_s: float
    finished_s: dict[str, float]  # env -> when its batch's last trajectory ended


def episode_s(ep: Episode, decode_tok_s: float) -> float:
    return sum(t.response / decode_tok_s + (t.latency_s if i < len(ep.turns) - 1 else 0.0)
               for i, t in enumerate(ep.turns))


def draw_step(envs: list[str], tasks: int, group: int, seed: int) -> dict[str, list[Episode]]:
    """One sync step's episodes: per env, `tasks` × `group` (a group's members are one task)."""
    return {env: [draw_episode(PROFILES[env], f"{env}-{i}", random.Random(f"{seed}:{env}:{i}"))
                  for i in range(tasks * group)] for env in envs}


def _replay(lc: Lifecycle, tid: str, ep: Episode, start: float, decode_tok_s: float) -> None:
    """Tell the lifecycle what the episode did, turn by turn, at its simulated times."""
    lc.on_submit(tid, ep.env, ep.prompt, now=start)
    now = start
    for i, turn in enumerate(ep.turns):
        lc.on_prefill(tid, ep.prompt if i == 0 else ep.turns[i - 1].observation, now=now)
        lc.on_decode(tid, now=now)
        now += turn.response / decode_tok_s
        if i == len(ep.turns) - 1:
            lc.on_done(tid, now=now, response_tokens=turn.response)
        else:
            lc.on_tool(tid, turn.response, now=now, tool=ep.tool)
            now += turn.latency_s


async def run_step(queue: Queue, step: dict[str, list[Episode]], group: int, slots: int,
                   forecaster: Forecaster, decode_tok_s: float = 50.0) -> StepResult:
    """Submit one batch per env in `step`'s order, run them on `slots` slots, return when the
    last trajectory ends (the sync step's makespan). The forecaster learns from every episode."""
    lc = Lifecycle(clock=lambda: 0.0, observers=[forecaster])
    episodes: dict[str, Episode] = {}
    env_of: dict[str, str] = {}
    for env, eps in step.items():
        b = await queue.enqueue(RolloutRequest(tasks=[{"i": i} for i in range(len(eps) // group)], env=env,
                                               group_size=group))
        env_of[b.id] = env
        for k, ep in enumerate(eps):
            episodes[f"{b.id}-{k // group}-{k % group}"] = ep
    now, seq, free = 0.0, 0, slots
    running: list = []
    finished: dict[str, float] = {}
    while True:
        if free:
            for c in await queue.claim_many("sim", free):
                ep = episodes[c.trajectory_id]
                _replay(lc, c.trajectory_id, ep, now, decode_tok_s)
                seq += 1
                heapq.heappush(running, (now + episode_s(ep, decode_tok_s), seq, c))
                free -= 1
        if not running:
            break
        now, _, c = heapq.heappop(running)
        bid = batch_of(c.trajectory_id)
        await queue.complete(c, Trajectory(id=c.trajectory_id, batch_id=bid, group_index=0, sample_index=0,
                                           env=env_of[bid], task={}, state=TrajectoryState.completed, reward=0.0))
        finished[env_of[bid]] = now
        free += 1
    return StepResult(now, finished)
