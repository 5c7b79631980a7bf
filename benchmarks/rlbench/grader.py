"""The grader: scores the base model once, then every submitted model folder, within a budget.

    grader = Grader(State.load(STATE), ServiceEvaluator(url, spec, tasks), engine="vllm")
    run = await grader.start()              # baseline scored and recorded once; the clock starts
    rec = await grader.submit("checkpoints/step-10")   # -> SubmissionRecord (score, improvement, best)
    grader.time()                           # -> Budget

Submissions are evaluated one at a time (a lock; a waiting one gives up after `wait_s` with
429). Each is recorded, scored or not. Bad submissions raise `ApiError`s, which the server
renders in the project's one error shape; this module does not import FastAPI.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.rlbench.evaluate import EvaluationFailed, Evaluator, NotLoadable
from benchmarks.rlbench.records import RunRecord, Status, SubmissionRecord
from benchmarks.rlbench.workspace import State, model_problem
from wire.errors import ApiError, NotFound, Overloaded


class ModelNotFound(NotFound):
    code = "model_not_found"


class NotAModel(ApiError):
    status, code = 422, "not_a_model"


class BudgetSpent(ApiError):
    status, code = 403, "budget_spent"


class EvaluationError(ApiError):
    status, code = 503, "evaluation_failed"


@dataclass(slots=True)
class Budget:
    budget_s: float
    started_at: float
    elapsed_s: float

    @property
    def remaining_s(self) -> float:
        return max(self.budget_s - self.elapsed_s, 0.0)

    @property
    def spent(self) -> bool:
        return self.elapsed_s >= self.budget_s


class Grader:
    def __init__(self, state: State, evaluate: Evaluator, engine: str, clock: Callable[[], float] = time.time,
                 wait_s: float = 1800.0) -> None:
        self.state, self.evaluate, self.engine, self.clock, self.wait_s = state, evaluate, engine, clock, wait_s
        self.run: RunRecord | None = None
        self.best = 0.0
        self.count = 0  # submissions so far, every status
        self._lock = asyncio.Lock()

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    async def start(self) -> RunRecord:
        """Score the base model, unless this run's record already has it (a restarted grader
        keeps its baseline and its clock)."""
        cfg, records = self.state.config, self.state.records
        run = records.run(cfg.run)
        if run is None:
            ev = await self.evaluate(Path(cfg.base_model))  # EvaluationFailed: the grader cannot start
            spec = self.state.task
            run = RunRecord(cfg.run, spec.name, spec.level.value, spec.env, self.engine, cfg.budget_s, self.clock(),
                            ev.score, round(ev.seconds, 3), ev.n_tasks, cfg.base_model, cfg.workspace, ev.failures)
            records.append(run)
        elif run.engine != self.engine:
            raise ValueError(f"run {run.run} was scored with engine {run.engine!r}; serve it with that engine")
        subs = records.submissions(cfg.run)
        self.run, self.count = run, max((s.n for s in subs), default=0)
        self.best = max([run.baseline, *(s.score for s in subs if s.status is Status.scored)])
        return run

    def time(self) -> Budget:
        assert self.run is not None, "start() first"
        return Budget(self.run.budget_s, self.run.started_at, self.clock() - self.run.started_at)

    async def submit(self, model: str) -> SubmissionRecord:
        assert self.run is not None, "start() first"
        self.count += 1
        given = Path(model).expanduser()
        path = (given if given.is_absolute() else Path(self.state.config.workspace) / given).resolve()
        rec = SubmissionRecord(self.run.run, self.count, self.clock(), round(self.time().elapsed_s, 3), str(path),
                               Status.rejected, best=self.best)
        try:
            if self.time().spent:
                raise BudgetSpent(f"the budget of {self.run.budget_s:g} s is spent; no more submissions")
            if not path.is_dir():
                raise ModelNotFound(f"no folder {path}", {"model": model})
            if (why := model_problem(path)) is not None:
                raise NotAModel(why, {"model": model})
            try:
                async with asyncio.timeout(self.wait_s):
                    await self._lock.acquire()
            except TimeoutError:
                raise Overloaded(f"another submission was still being evaluated after {self.wait_s:g} s") from None
            try:
                ev = await self.evaluate(path)
            except NotLoadable as e:
                raise NotAModel(str(e), {"model": model}) from e
            except EvaluationFailed as e:
                rec.status, rec.failures = Status.failed, e.failures
                raise EvaluationError(str(e), {"failures": e.failures}) from e
            finally:
                self._lock.release()
        except ApiError as e:
            rec.error = f"{e.code}: {e.message}"
            self.state.records.append(rec)
            raise
        self.best = max(self.best, ev.score)
        rec.status, rec.score, rec.best = Status.scored, ev.score, self.best
        rec.improvement = round(ev.score - self.run.baseline, 6)
        rec.failures, rec.truncated, rec.usable, rec.n_tasks = ev.failures, ev.truncated, ev.usable, ev.n_tasks
        rec.eval_s = round(ev.seconds, 3)
        self.state.records.append(rec)
        return rec
