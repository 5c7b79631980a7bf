"""A verifiers SingleTurnEnv with a two-function rubric, loaded by its module name."""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset


def exact(completion, answer, **kwargs) -> float:
    return 1.0 if completion[-1]["content"].strip() == answer else 0.0


def short(completion, **kwargs) -> float:
    return 1.0 if len(completion[-1]["content"]) <= 10 else 0.0


def load_environment(**kwargs) -> vf.Environment:
    rows = [{"question": f"What is {a} + {b}? Reply with the number only.", "answer": str(a + b)}
            for a, b in ((2, 3), (10, 32), (7, 7))]
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[exact, short], weights=[1.0, 0.2]))
