"""`calc`: multi-turn arithmetic with a calculator tool.

The model may write `calc: <expression>` to get `result: <value>` back, any number of
times up to `max_calls`, then answers with `answer: <number>` (exact match, reward 1).
A malformed expression comes back as text (a tool error is data, not a crash).
"""

from __future__ import annotations

import ast
import operator
import re
from typing import Any

from env_workers.env import EnvError, StepResult
from env_workers.envs.problems import parse_answer, task_problem
from env_workers.registry import EnvSpec, register
from wire import Message

SYSTEM = (
    "Solve the problem. You have a calculator: write 'calc: <expression>' and you will get "
    "'result: <value>'. Example: 'calc: 12 * 7' -> 'result: 84'. When you know the answer, "
    "write 'answer: <number>'."
)
_CALC = re.compile(r"calc\s*:\s*([^\n]+)", re.I)
_ANSWER = re.compile(r"answer\s*[:=]", re.I)
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Mod: operator.mod}


def evaluate(expr: str) -> int:
    """Integer arithmetic only: + - * // % and parentheses, bounded operand size."""

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and abs(node.value) < 10**12:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            a, b = ev(node.left), ev(node.right)
            if abs(a) > 10**12 or abs(b) > 10**12:
                raise ValueError("number too large")
            return _OPS[type(node.op)](a, b)
        raise ValueError("only integers and + - * // % are allowed")

    return ev(ast.parse(expr.strip().replace("/", "//").replace("////", "//"), mode="eval"))


class CalcEnv:
    def __init__(self, max_calls: int = 6) -> None:
        self.max_calls = max_calls
        self._answer: int | None = None
        self._calls = 0
        self._done = True

    def reset(self, task: dict[str, Any], seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        try:
            question, self._answer = task_problem(task)
        except (ValueError, TypeError) as e:
            raise EnvError(f"bad calc task: {e}") from e
        self._calls, self._done = 0, False
        return [Message(role="system", content=SYSTEM), Message(role="user", content=question)], {}

    def step(self, action: str) -> StepResult:
        if self._done:
            raise EnvError("step() after the episode ended; call reset()")
        call = _CALC.search(action)
        if _ANSWER.search(action) and not call:
            self._done = True
            got = parse_answer(action)
            return StepResult([], float(got == self._answer), True, False,
                              {"parsed": got, "expected": self._answer, "calls": self._calls})
        if call:
            self._calls += 1
            try:
                text = f"result: {evaluate(call.group(1))}"
            except (ValueError, SyntaxError, ZeroDivisionError, RecursionError) as e:
                text = f"error: {e}"
            truncated = self._calls >= self.max_calls
            self._done = truncated
            return StepResult([Message(role="user", content=text)], 0.0, False, truncated, {"calls": self._calls})
        return StepResult([Message(role="user", content="Write 'calc: <expression>' or 'answer: <number>'.")],
                          0.0, False, False, {"calls": self._calls})

    def close(self) -> None:
        self._done = True


register(EnvSpec("calc", CalcEnv, "multi-turn arithmetic with a calculator tool",
                 example_tasks=[{"seed": 3}, {"question": "What is 123 times 45?", "answer": 5535}],
                 inline=True))
