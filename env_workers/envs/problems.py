"""Generated arithmetic word problems (seeded; nothing downloaded).

    >>> p = word_problem(7)
    >>> sorted(p)
    ['answer', 'expression', 'question']
"""

from __future__ import annotations

import random
import re
from typing import Any

_NAMES = ["Ava", "Ben", "Chen", "Dana", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Juno"]
_ITEMS = ["apples", "marbles", "stickers", "books", "coins", "shells", "pencils", "cards"]


def word_problem(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    kind = rng.choice(["add", "sub", "mul"])
    if kind == "add":
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        q = f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?"
        return {"question": q, "answer": a + b, "expression": f"{a} + {b}"}
    if kind == "sub":
        a = rng.randint(20, 199)
        b = rng.randint(1, a)
        q = f"{name} had {a} {item} and gave away {b}. How many {item} are left?"
        return {"question": q, "answer": a - b, "expression": f"{a} - {b}"}
    a, b = rng.randint(2, 19), rng.randint(2, 19)
    q = f"{name} has {a} boxes with {b} {item} in each. How many {item} are there in all?"
    return {"question": q, "answer": a * b, "expression": f"{a} * {b}"}


def task_problem(task: dict[str, Any]) -> tuple[str, int]:
    """The (question, answer) of a task payload: explicit, or generated from `seed`."""
    if "question" in task and "answer" in task:
        return str(task["question"]), int(task["answer"])
    if "seed" in task:
        p = word_problem(int(task["seed"]))
        return p["question"], p["answer"]
    raise ValueError("task needs 'question' and 'answer', or 'seed'")


_ANSWER = re.compile(r"answer\s*[:=]\s*(-?[\d,]+)", re.I)
_INT = re.compile(r"-?\d[\d,]*")


def parse_answer(text: str) -> int | None:
    """'answer: N' if present, else the last integer in the text."""
    m = _ANSWER.findall(text) or _INT.findall(text)
    if not m:
        return None
    try:
        return int(m[-1].replace(",", ""))
    except ValueError:
        return None
