"""Rollouts from the service and the GRPO step loop, in sync or async mode.

- sync: submit a step's groups, wait for all, train, push weights, repeat.
- async: keep `inflight` groups running at all times (continuous refill); a step trains as
  soon as `prompts` complete groups are in (early stop; the rest carry over); a member
  with a turn more than `max_staleness` policy versions old is masked; rollouts in flight
  during a weight update are not restarted: they continue on the new weights (their turns
  then carry different versions).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from examples.grpo.learner import Learner
from examples.grpo.tasks import HELD_OUT_BASE, TASKS, TaskSpec
from trainer_client import AsyncRolloutClient
from trainer_client.grpo import advantages, within_staleness
from wire import Trajectory

TASK_DEFAULTS = ("prompts", "lr", "max_tokens", "max_turns", "format_bonus")  # None in a Config: from its task


@dataclass(slots=True)
class Config:
    url: str | None = None
    out: Path | None = None  # None: /tmp/grpo-<task>
    task: str = "calc"  # a name in TASKS
    level: int = 1  # household: the textworld level (1 and 2: one room; 3: the house)
    mode: str = "sync"
    steps: int = 30
    prompts: int | None = None  # groups per step (None: the task's default)
    group_size: int = 8
    inflight: int = 12  # async: groups kept running
    max_staleness: int = 1  # async: policy versions a turn may lag behind
    lr: float | None = None  # None: the task's default
    clip: float = 0.2
    temperature: float = 1.0
    max_tokens: int | None = None  # None: the task's default
    max_turns: int | None = None
    eval_tasks: int = 64
    max_minutes: float = 0.0  # stop training after this much wall time (0: run all the steps)
    eval_every: int = 0  # also measure held-out success every N steps (0: before and after only)
    target: float = 0.0  # with eval_every: stop training once a periodic held-out success reaches it (0: never)
    eval_greedy: bool = False
    seed: int = 0
    threads: int = 2
    keep: int = 2  # checkpoints kept on disk
    # Added to the env's reward for a well-formed episode (calc: a tool call, then an answer).
    # With the env's reward alone, 64 calc rollouts of the base model had no success: no signal.
    format_bonus: float | None = None
    redis_url: str | None = None

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; one of {sorted(TASKS)}")
        spec = self.spec
        self.out = Path(self.out or f"/tmp/grpo-{self.task}")
        for name in TASK_DEFAULTS:
            if getattr(self, name) is None:
                setattr(self, name, getattr(spec, name))

    @property
    def spec(self) -> TaskSpec:
        return TASKS[self.task]

    @property
    def sampling(self) -> dict:
        return {"temperature": self.temperature, "max_tokens": self.max_tokens, "stop": ["\n"]}



async def rollouts(client: AsyncRolloutClient, tasks: list[dict], cfg: Config, group_size: int,
                   sampling: dict | None = None) -> list[Trajectory]:
    batch = await client.submit(tasks, env=cfg.spec.env, group_size=group_size, sampling=sampling or cfg.sampling,
                                max_turns=cfg.max_turns)
    return [t async for t in client.iter_results(batch.id)]


async def held_out(client: AsyncRolloutClient, cfg: Config, greedy: bool = False) -> float:
    tasks = [cfg.spec.make(HELD_OUT_BASE + i, cfg.level) for i in range(cfg.eval_tasks)]
    sampling = {**cfg.sampling, "temperature": 0.0} if greedy else cfg.sampling
    trajs = await rollouts(client, tasks, cfg, 1, sampling)
    usable = [t for t in trajs if t.usable]
    return sum(t.reward == 1.0 for t in usable) / max(len(usable), 1)


@dataclass(slots=True)
class StepRecord:
    step: int
    version: int
    reward: float
    success: float
    trajectories: int
    masked_failed: int
    masked_stale: int
    spanning_versions: int
    rollout_s: float
    train_s: float
    update_s: float
    wall_s: float
    well_formed: float = 0.0  # the task's format (calc: a tool call, then an answer)
    held_out: float | None = None  # with --eval-every
    eval_s: float = 0.0
    train: dict = field(default_factory=dict)


class Trainer:
    def __init__(self, client: AsyncRolloutClient, learner: Learner, cfg: Config):
        self.client, self.learner, self.cfg = client, learner, cfg
        self.rng = random.Random(cfg.seed)
        self.version = 0
        self.history: list[StepRecord] = []
        self.t0 = time.monotonic()

    def should_stop(self) -> bool:
        """--max-minutes spent, or the last periodic held-out success reached --target."""
        if self.cfg.max_minutes and time.monotonic() - self.t0 > self.cfg.max_minutes * 60:
            print(f"--max-minutes {self.cfg.max_minutes:g} reached: training stops", flush=True)
            return True
        last = self.history[-1].held_out if self.history else None
        if self.cfg.target and last is not None and last >= self.cfg.target:
            print(f"held-out success {last:.3f} reached --target {self.cfg.target:g}: training stops", flush=True)
            return True
        return False

    def next_task(self) -> dict:
        return self.cfg.spec.make(self.rng.randrange(10**8), self.cfg.level)

    async def train_and_push(self, step: int, trajs: list[Trajectory], rollout_s: float, stale: set[str]) -> None:
        cfg = self.cfg
        # Stale members leave the group entirely: they count neither in its statistics nor in the loss.
        fresh = [t for t in trajs if t.id not in stale]
        env_reward = {t.id: t.reward or 0.0 for t in trajs}
        if cfg.format_bonus:
            for t in fresh:
                if t.usable and t.reward is not None:
                    t.reward += cfg.format_bonus * cfg.spec.well_formed(t)
        t1 = time.monotonic()
        stats = await asyncio.to_thread(self.learner.step, fresh, advantages(fresh))
        t2 = time.monotonic()
        folder = self.learner.save(cfg.out / f"step-{step}")
        result = await self.client.update_weights(path=str(folder))
        if result.version <= self.version:
            raise RuntimeError(f"policy version did not advance: {self.version} -> {result.version}")
        self.version = result.version
        old = cfg.out / f"step-{step - cfg.keep}"
        if step - cfg.keep >= 1 and old.exists():
            shutil.rmtree(old)
        usable = [t for t in trajs if t.usable]
        rec = StepRecord(step, self.version, sum(env_reward[t.id] for t in usable) / max(len(usable), 1),
                         sum(env_reward[t.id] == 1.0 for t in usable) / max(len(usable), 1), len(trajs),
                         sum(1 for t in trajs if not t.usable and t.id not in stale), len(stale),
                         sum(1 for t in trajs if len(set(t.policy_versions)) > 1),
                         rollout_s, t2 - t1, time.monotonic() - t2, time.monotonic() - self.t0,
                         sum(map(cfg.spec.well_formed, usable)) / max(len(usable), 1), train=stats)
        if cfg.eval_every and cfg.eval_tasks and step % cfg.eval_every == 0:
            t3 = time.monotonic()
            rec.held_out = await held_out(self.client, cfg)
            rec.eval_s = time.monotonic() - t3
        self.history.append(rec)
        print(f"step {step:3d}  v{rec.version}  success {rec.success:.3f}  well-formed {rec.well_formed:.2f}  "
              f"groups {stats['groups_trained']}/{len(trajs) // cfg.group_size}  "
              f"masked {rec.masked_failed}+{rec.masked_stale} stale  spanning {rec.spanning_versions}  "
              f"kl {stats['kl']:.4f}  clip {stats['clip_frac']:.3f}  rollout {rollout_s:.0f}s "
              f"train {rec.train_s:.0f}s update {rec.update_s:.1f}s  wall {rec.wall_s:.0f}s"
              + (f"  held-out {rec.held_out:.3f} ({rec.eval_s:.0f}s)" if rec.held_out is not None else ""),
              flush=True)

    async def run_sync(self) -> None:
        first = len(self.history) + 1
        for step in range(first, first + self.cfg.steps):
            if self.should_stop():
                break
            t0 = time.monotonic()
            trajs = await rollouts(self.client, [self.next_task() for _ in range(self.cfg.prompts)], self.cfg,
                                   self.cfg.group_size)
            await self.train_and_push(step, trajs, time.monotonic() - t0, set())

    async def run_async(self) -> None:
        cfg = self.cfg
        done: asyncio.Queue[list[Trajectory] | BaseException] = asyncio.Queue()
        running: dict[asyncio.Task, str | None] = {}  # group task -> its batch id, once submitted
        refilling = True

        async def one_group() -> None:
            # One batch per group, so a group is usable the moment its own members finish.
            me = asyncio.current_task()
            try:
                batch = await self.client.submit([self.next_task()], env=cfg.spec.env, group_size=cfg.group_size,
                                                  sampling=cfg.sampling, max_turns=cfg.max_turns)
                running[me] = batch.id
                done.put_nowait([t async for t in self.client.iter_results(batch.id)])
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 (re-raised by the step loop)
                done.put_nowait(e)

        def finished(task: asyncio.Task) -> None:
            running.pop(task, None)
            refill()  # continuous refill, also while a step trains

        def refill() -> None:
            while refilling and len(running) < cfg.inflight:
                t = asyncio.create_task(one_group())
                running[t] = None
                t.add_done_callback(finished)

        ready: list[list[Trajectory]] = []
        try:
            refill()
            first = len(self.history) + 1
            for step in range(first, first + cfg.steps):
                if self.should_stop():
                    break
                t0 = time.monotonic()
                while len(ready) < cfg.prompts:  # early stop: train once enough usable groups are in
                    got = await asyncio.wait_for(done.get(), timeout=1800)
                    if isinstance(got, BaseException):
                        raise got
                    if sum(t.usable for t in got) >= 2:
                        ready.append(got)
                groups, ready = ready[:cfg.prompts], ready[cfg.prompts:]
                trajs = [t for g in groups for t in g]
                stale = {t.id for t in trajs if t.usable and not within_staleness(t, self.version, cfg.max_staleness)}
                # Rollouts keep running while this step trains; the weight update freezes them
                # (`pause?mode=keep`) and they continue on the new weights, never restarted.
                await self.train_and_push(step, trajs, time.monotonic() - t0, stale)
        finally:
            refilling = False
            batches = [b for b in running.values() if b]
            for t in list(running):
                t.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            for b in batches:  # leftover rollouts: stop them on the service too
                with contextlib.suppress(Exception):
                    await self.client.cancel(b)
