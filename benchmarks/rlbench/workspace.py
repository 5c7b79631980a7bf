"""`setup`: an isolated workspace for the agent, and the grader's state folder beside it.

    WORKSPACE/                        what the agent gets
      INSTRUCTIONS.md                 the task, the budget, how to get rollouts, how to submit
      task.json                       the same, for scripts
      base_model -> MODEL             the model to improve (a symlink; do not change it)
      data/train.jsonl                train tasks only, one JSON object per line
      checkpoints/                    a place for the agent's model folders
    STATE/                            the grader's; never inside the workspace
      config.json                     run id, task, paths, budget, grader port, split salt
      test.jsonl                      the hidden test tasks
      records.jsonl                   every run and submission (records.py)
      logs/                           the grading service's processes

Nothing in the workspace names the state folder, and no test task is written into it (a test
checks every file). The default state folder is `WORKSPACE.grader` next to the workspace.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.rlbench import catalog, instructions
from benchmarks.rlbench.records import Records

WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin")


def model_problem(folder: Path) -> str | None:
    """Why `folder` is not a model folder the engines can load, or None if it looks like one."""
    if not (folder / "config.json").is_file():
        return f"{folder} has no config.json"
    if not any(any(folder.glob(p)) for p in WEIGHT_FILES):
        return f"{folder} has no weights ({' or '.join(WEIGHT_FILES)})"
    return None


@dataclass(slots=True)
class Config:
    run: str
    task: str
    workspace: str
    base_model: str  # resolved: the folder the symlink points at
    budget_s: float
    port: int  # the grader listens on 127.0.0.1:port (INSTRUCTIONS.md names it)
    salt: str  # decides the train/test split; secret from the agent
    created_at: float

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass(slots=True)
class State:
    dir: Path
    config: Config

    @classmethod
    def load(cls, state_dir: str | Path) -> State:
        d = Path(state_dir).resolve()
        path = d / "config.json"
        if not path.is_file():
            raise SystemExit(f"{d} is not a grader state folder (no config.json); run `setup` first")
        return cls(d, Config(**json.loads(path.read_text())))

    @property
    def task(self) -> catalog.BenchTask:
        return catalog.TASKS[self.config.task]

    @property
    def records(self) -> Records:
        return Records(self.dir / "records.jsonl")

    @property
    def logs(self) -> Path:
        return self.dir / "logs"

    def test_tasks(self) -> list[dict[str, Any]]:
        return _read_jsonl(self.dir / "test.jsonl")


def setup(task: str, workspace: str | Path, base_model: str | Path, budget_min: float,
          state_dir: str | Path | None = None, port: int | None = None,
          service_url: str = "http://127.0.0.1:8000", salt: str | None = None) -> State:
    """Create the workspace and the grader's state; raise ValueError on a bad argument."""
    if task not in catalog.TASKS:
        raise ValueError(f"unknown task {task!r}; known: {', '.join(catalog.TASKS)}")
    if budget_min <= 0:
        raise ValueError("the budget must be positive")
    ws = Path(workspace).resolve()
    state = Path(state_dir).resolve() if state_dir else ws.with_name(ws.name + ".grader")
    if state == ws or state.is_relative_to(ws) or ws.is_relative_to(state):
        raise ValueError(f"the state folder {state} must lie outside the workspace {ws} (and not contain it)")
    for d in (ws, state):
        if d.exists() and any(d.iterdir()):
            raise ValueError(f"{d} exists and is not empty")
    model = Path(base_model).resolve()
    if (why := model_problem(model)) is not None:
        raise ValueError(f"base model: {why}")

    spec = catalog.TASKS[task]
    if salt is not None:
        split = catalog.split(spec, salt)
    else:
        # A drawn salt can leave a small pool short of test-side contents (search_qa: 165
        # contents, about 41 on the test side, fewer than the 32 wanted once in ~20 salts):
        # draw another. The salt stays as secret; only salts that fit are used.
        for attempt in range(20):
            salt = secrets.token_hex(16)
            try:
                split = catalog.split(spec, salt)
                break
            except ValueError:
                if attempt == 19:
                    raise
    if port is None:
        from rollout_service.up import free_port

        port = free_port()
    cfg = Config(run=f"{task}-{secrets.token_hex(4)}", task=task, workspace=str(ws), base_model=str(model),
                 budget_s=budget_min * 60, port=port, salt=salt, created_at=time.time())

    (state / "logs").mkdir(parents=True, exist_ok=True)
    (state / "config.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n")
    _write_jsonl(state / "test.jsonl", split.test)

    (ws / "data").mkdir(parents=True, exist_ok=True)
    (ws / "checkpoints").mkdir()
    (ws / "base_model").symlink_to(model, target_is_directory=True)
    _write_jsonl(ws / "data" / "train.jsonl", split.train)
    info = instructions.task_info(spec, cfg, len(split.train), service_url)
    (ws / "task.json").write_text(json.dumps(info, indent=2) + "\n")
    (ws / "INSTRUCTIONS.md").write_text(instructions.render(spec, cfg, info))
    return State(state, cfg)


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
