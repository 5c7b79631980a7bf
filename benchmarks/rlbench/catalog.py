"""The six tasks of the benchmark, their levels, and their train / hidden-test split.

    static rule-based        math, code         a fixed checker scores one answer
    judge-based              instruct           a fixed LLM judge scores the answer
    closed-loop interactive  household, shop,   the model acts over many turns and the
                             search_qa          environment answers each action

Every task is an environment of the service (`env_workers/envs/`) plus a task generator.
The split is by *content*, not only by seed: a task's content is the first user message
the model sees, and a salted hash of it puts it on the train side or the test side
(`TEST_SHARE` of all contents go to test). So no hidden test task shows the model anything
a train task shows it, even where a generator has few distinct prompts (code has 35,
search_qa 165). The salt is drawn at setup and kept only in the grader's state folder.
Train tasks are seeds counted up from 0; test tasks are seeds drawn from a far range.

Non-goal: secrecy against an agent that reads the generators' source and trains on tasks
outside its train file; the rules forbid that, and for small pools it would find test
contents by elimination.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from itertools import islice
from typing import Any

from benchmarks.rlbench import ifeval

TEST_SHARE = 0.25
TEST_SEED_RANGE = (1_000_000, 2**31)  # far from the train seeds, which count up from 0


class Level(str, Enum):
    static = "static rule-based"
    judge = "judge-based"
    interactive = "closed-loop interactive"


def seed_task(seed: int) -> dict[str, Any]:
    return {"seed": seed}


@dataclass(frozen=True, slots=True)
class BenchTask:
    name: str
    level: Level
    env: str
    goal: str  # what the model must do and how it is rewarded, for INSTRUCTIONS.md
    n_train: int
    n_test: int
    max_turns: int
    max_tokens: int  # per turn
    make: Callable[[int], dict[str, Any]] = field(default=seed_task)
    # code has 35 prompts, each with many hidden test sets: there a test prompt may repeat
    # (with other tests); elsewhere test contents are distinct.
    repeat_contents: bool = False

    def sampling(self) -> dict[str, Any]:
        """Evaluation sampling: greedy, seeded (the simulated engine is random without a seed)."""
        return {"temperature": 0.0, "max_tokens": self.max_tokens, "seed": 0}


TASKS: dict[str, BenchTask] = {t.name: t for t in (
    BenchTask("math", Level.static, "math",
              "Solve an arithmetic word problem and end the reply with 'answer: N'. Reward 1 for the exact "
              "number, else 0. One turn.", n_train=1000, n_test=64, max_turns=1, max_tokens=256),
    BenchTask("code", Level.static, "code",
              "Write the Python function a one-line description asks for, in one ```python block. Reward: the "
              "fraction of hidden unit tests that pass, run in a sandbox. Up to 3 turns.",
              n_train=400, n_test=32, max_turns=3, max_tokens=512, repeat_contents=True),
    BenchTask("instruct", Level.judge, "judge",
              "Write a short text that follows two explicit instructions (length, case, required words, format, "
              "...). A fixed LLM judge scores it 0-10 against a rubric naming the instructions; reward = "
              "score / 10. One turn.", n_train=400, n_test=32, max_turns=1, max_tokens=384, make=ifeval.task),
    BenchTask("household", Level.interactive, "textworld",
              "Play a household text game (rooms, receptacles, objects): one command per turn (look, go, open, "
              "take, put, clean, ...) until the goal holds. Reward 1 on success, else 0.",
              n_train=400, n_test=16, max_turns=30, max_tokens=64),
    BenchTask("shop", Level.interactive, "shop",
              "Find and buy the product an instruction describes with search[...] and click[...]. Dense reward "
              "on `buy now`: the share of matched attributes, options and price limit.",
              n_train=400, n_test=16, max_turns=15, max_tokens=64),
    BenchTask("search_qa", Level.interactive, "search_qa",
              "Answer a one- or two-hop question over a local corpus with `search: ...`, `open: ...` and "
              "finally `answer: ...`. Reward 1 on a normalized exact match, else 0.",
              n_train=400, n_test=32, max_turns=12, max_tokens=96),
)}


@dataclass(slots=True)
class Split:
    train: list[dict[str, Any]]
    test: list[dict[str, Any]]


class Contents:
    """A task's content: the user text the environment opens the episode with."""

    def __init__(self, env: str) -> None:
        from env_workers import registry

        self._env = registry.make(env)

    def __call__(self, task: dict[str, Any]) -> str:
        obs, _ = self._env.reset(task)
        return "\n".join(m.content for m in obs if m.role == "user")

    def close(self) -> None:
        self._env.close()


def held_out(content: str, salt: str) -> bool:
    """True when `content` belongs to the test side under this salt."""
    h = hashlib.sha256(f"{salt}\0{content}".encode()).digest()
    return int.from_bytes(h[:8], "big") < TEST_SHARE * 2**64


def split(task: BenchTask, salt: str, n_train: int | None = None, n_test: int | None = None) -> Split:
    """Train tasks (seeds 0, 1, ... whose content is on the train side) and test tasks (seeds
    drawn from TEST_SEED_RANGE, seeded by the salt, whose content is on the test side)."""
    n_train = task.n_train if n_train is None else n_train
    n_test = task.n_test if n_test is None else n_test
    contents = Contents(task.env)
    try:
        candidates = (task.make(s) for s in range(n_train * 20))
        train = list(islice((t for t in candidates if not held_out(contents(t), salt)), n_train))
        rng, seen, test = random.Random(f"{salt}:{task.name}"), set(), []
        for _ in range(n_test * 200):  # bounded: too few test-side contents fail below
            s = rng.randrange(*TEST_SEED_RANGE)
            t = task.make(s)
            c = contents(t)
            key = s if task.repeat_contents else c
            if key not in seen and held_out(c, salt):
                seen.add(key)
                test.append(t)
                if len(test) == n_test:
                    break
    finally:
        contents.close()
    if len(train) < n_train or len(test) < n_test:
        raise ValueError(f"{task.name}: only {len(train)} train / {len(test)} test tasks found "
                         f"(wanted {n_train} / {n_test})")
    return Split(train, test)
