"""The grader's record: `STATE/records.jsonl`, one JSON object per line, appended, never rewritten.

    {"type": "run", "run", "task", "level", "env", "engine", "budget_s", "started_at", "baseline", ...}
    {"type": "submission", "run", "n", "t_s", "model", "status", "score", "improvement", "best",
     "failures": {kind: count}, "truncated", "usable", "n_tasks", "eval_s", "error"}

A run is one workspace's session: its record is written once, when the grader has scored the
base model and the clock starts. Every submission the grader accepted for checking is
recorded, whatever became of it: `scored`, `failed` (the evaluation broke: infrastructure,
not the model) or `rejected` (bad folder, budget spent). `summary.py` reads these files.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Any


class Status(str, Enum):
    scored = "scored"
    failed = "failed"
    rejected = "rejected"


@dataclass(slots=True)
class RunRecord:
    run: str
    task: str
    level: str
    env: str
    engine: str
    budget_s: float
    started_at: float  # unix time the clock started (after the baseline was scored)
    baseline: float
    baseline_eval_s: float
    n_test: int
    base_model: str
    workspace: str
    baseline_failures: dict[str, int] = field(default_factory=dict)
    type: str = "run"


@dataclass(slots=True)
class SubmissionRecord:
    run: str
    n: int  # 1, 2, ... in arrival order
    at: float  # unix time it arrived
    t_s: float  # seconds since the run's clock started
    model: str
    status: Status
    score: float | None = None
    improvement: float | None = None
    best: float | None = None  # best score so far, the base model's included
    failures: dict[str, int] = field(default_factory=dict)  # failure kind -> test trajectories
    truncated: int = 0
    usable: int = 0
    n_tasks: int = 0
    eval_s: float = 0.0
    error: str | None = None
    type: str = "submission"


def _load(cls, obj: dict[str, Any]):
    known = {f.name for f in fields(cls)}
    rec = cls(**{k: v for k, v in obj.items() if k in known})
    if cls is SubmissionRecord:
        rec.status = Status(rec.status)
    return rec


class Records:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def append(self, rec: RunRecord | SubmissionRecord) -> None:
        line = json.dumps(asdict(rec), default=lambda v: v.value if isinstance(v, Enum) else str(v))
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())  # a record survives a crash of the grader right after

    def read(self) -> list[RunRecord | SubmissionRecord]:
        if not self.path.exists():
            return []
        out: list[RunRecord | SubmissionRecord] = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                obj = json.loads(line)
                out.append(_load(RunRecord if obj.get("type") == "run" else SubmissionRecord, obj))
        return out

    def run(self, run_id: str) -> RunRecord | None:
        return next((r for r in self.read() if isinstance(r, RunRecord) and r.run == run_id), None)

    def submissions(self, run_id: str) -> list[SubmissionRecord]:
        return [r for r in self.read() if isinstance(r, SubmissionRecord) and r.run == run_id]
