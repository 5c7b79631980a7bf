"""`reasoning_gym:NAME` and `reasoning_gym_retry:NAME`: any generator of the reasoning-gym package.

A task is `{"seed": N}`, optionally with `"config": {...}` (the generator's own config fields,
e.g. `{"min_animals": 2}`; `composite` needs `"datasets": [{"name", "weight", "config"}, ...]`) and, for the retry variant,
`"attempts": K` (default 3, at most 10), and `"examples": K` (at most 8): K worked examples of the
same generator and config before the question, as earlier chat turns (its question, then
`<answer>ANSWER</answer>`), drawn at seed N + 2**31 so they never show another task's item of
the usual seed ranges; a small model rarely answers in tags without one. The item is
`create_dataset(NAME, seed=N, size=1, **config)[0]`: the same seed gives the same problem on
every worker. The reply's last `<answer>...</answer>` is scored by the dataset's own `score_answer` (rewards in [0, 1]).

Retry variant: a score below 1 with attempts left comes back as feedback ("not correct, try
again") and reward 0; the episode's reward is the score of its last answer, given on the last
step (trajectory rewards are sums over steps).
"""

from __future__ import annotations

import difflib
import functools
import json
from typing import Any

import reasoning_gym
from reasoning_gym.composite import DatasetSpec
from reasoning_gym.factory import DATASETS
from reasoning_gym.utils import SYSTEM_PROMPTS, extract_answer

from env_workers.env import EnvError, StepResult
from env_workers.registry import EnvSpec, UnknownEnv
from wire import Message

MAX_ATTEMPTS = 10
MAX_EXAMPLES = 8
EXAMPLE_SEED = 1 << 31  # worked examples come from seed N + this: a task's own item is never one
FEEDBACK = ("That answer is not correct (score {score:.2f}). Think again and give your final answer "
            "in <answer></answer> tags. Attempts left: {left}.")


class ReasoningGymEnv:
    def __init__(self, dataset: str, retry: bool = False) -> None:
        self.dataset, self.retry = dataset, retry
        self._data: Any = None
        self._entry: dict[str, Any] | None = None
        self._left = 0
        self._done = True

    def reset(self, task: dict[str, Any], seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        n, config = task.get("seed", seed), task.get("config", {})
        if not isinstance(n, int) or isinstance(n, bool) or not isinstance(config, dict):
            raise EnvError(f"a {self.dataset} task is {{'seed': int, 'config': {{...}}}}, got {task!r}"[:500])
        attempts = task.get("attempts", 3 if self.retry else 1)
        if not isinstance(attempts, int) or not 1 <= attempts <= MAX_ATTEMPTS or (attempts > 1 and not self.retry):
            raise EnvError(f"attempts must be 1..{MAX_ATTEMPTS} (more than 1 only for reasoning_gym_retry)")
        examples = task.get("examples", 0)
        if not isinstance(examples, int) or isinstance(examples, bool) or not 0 <= examples <= MAX_EXAMPLES:
            raise EnvError(f"examples must be an integer 0..{MAX_EXAMPLES}, got {examples!r}")
        key = json.dumps(config, sort_keys=True)
        try:  # a config the generator refuses is the task's fault
            self._data = _dataset(self.dataset, key, n, 1)
            shots = _dataset(self.dataset, key, n + EXAMPLE_SEED, examples) if examples else []
        except (TypeError, ValueError, AssertionError, KeyError, AttributeError) as e:
            raise EnvError(f"reasoning_gym {self.dataset!r} refused the task: {type(e).__name__}: {e}") from e
        self._entry = self._data[0]
        self._left, self._done = attempts, False
        opening = [Message(role="system", content=SYSTEM_PROMPTS["default"])]
        for shot in shots:
            opening += [Message(role="user", content=shot["question"]),
                        Message(role="assistant", content=f"<answer>{shot['answer']}</answer>")]
        return ([*opening, Message(role="user", content=self._entry["question"])],
                {"dataset": self.dataset, "attempts": attempts, "examples": examples})

    def step(self, action: str) -> StepResult:
        if self._done:
            raise EnvError("step() after the episode ended; call reset()")
        answer = extract_answer(action)
        score = float(self._data.score_answer(answer=answer, entry=self._entry)) if answer is not None else 0.0
        self._left -= 1
        info = {"answer": answer, "score": score, "expected": _jsonable(self._entry.get("answer"))}
        if score >= 1.0 or self._left <= 0:
            self._done = True
            return StepResult([], score, True, False, info)
        feedback = FEEDBACK.format(score=score, left=self._left) if answer is not None else (
            f"No <answer></answer> tags found. Give your final answer in them. Attempts left: {self._left}.")
        return StepResult([Message(role="user", content=feedback)], 0.0, False, False, info)

    def close(self) -> None:
        self._done = True


@functools.lru_cache(maxsize=64)  # a GRPO group opens the same task group_size times; some generators take ~1 s
def _dataset(name: str, config_json: str, seed: int, size: int) -> Any:
    config = json.loads(config_json)
    if name == "composite" and isinstance(config.get("datasets"), list):  # its parts, as JSON objects
        config["datasets"] = [DatasetSpec(**d) if isinstance(d, dict) else d for d in config["datasets"]]
    return reasoning_gym.create_dataset(name, seed=seed, size=size, **config)


def _jsonable(v: Any) -> Any:
    return v if v is None or isinstance(v, (str, int, float, bool)) else str(v)


def names() -> list[str]:
    return sorted(DATASETS)


def describe(name: str) -> str:
    doc = (DATASETS[name][0].__doc__ or "").strip().splitlines()
    return doc[0] if doc else name


def spec(family: str, name: str) -> EnvSpec:
    if name not in DATASETS:
        near = difflib.get_close_matches(name, DATASETS, n=3)
        raise UnknownEnv(f"reasoning-gym has no generator {name!r}" + (f"; did you mean {', '.join(near)}?" if near
                         else f"; it has {len(DATASETS)}: `rollout envs reasoning_gym` lists them"))
    retry = family == "reasoning_gym_retry"
    return EnvSpec(f"{family}:{name}", lambda: ReasoningGymEnv(name, retry),
                   f"reasoning-gym {name}: {describe(name)}" + (" (retried with feedback)" if retry else ""),
                   example_tasks=[{"seed": 1}, {"seed": 2}])
