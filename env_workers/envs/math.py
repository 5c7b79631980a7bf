"""`math`: single-turn arithmetic word problems with an exact-match reward."""

from __future__ import annotations

from typing import Any

from env_workers.env import EnvError, StepResult
from env_workers.envs.problems import parse_answer, task_problem
from env_workers.registry import EnvSpec, register
from wire import Message

SYSTEM = "Solve the problem. End your reply with 'answer: <number>'."


class MathEnv:
    def __init__(self) -> None:
        self._answer: int | None = None
        self._done = True

    def reset(self, task: dict[str, Any], seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        try:
            question, self._answer = task_problem(task)
        except (ValueError, TypeError) as e:
            raise EnvError(f"bad math task: {e}") from e
        self._done = False
        return [Message(role="system", content=SYSTEM), Message(role="user", content=question)], {}

    def step(self, action: str) -> StepResult:
        if self._done:
            raise EnvError("step() after the episode ended; call reset()")
        self._done = True
        got = parse_answer(action)
        reward = 1.0 if got is not None and got == self._answer else 0.0
        return StepResult([], reward, True, False, {"parsed": got, "expected": self._answer})

    def close(self) -> None:
        self._done = True


register(EnvSpec("math", MathEnv, "single-turn arithmetic word problems, exact-match reward",
                 example_tasks=[{"seed": 1}, {"question": "What is 6 times 7?", "answer": 42}],
                 inline=True))
