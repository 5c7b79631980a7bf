"""A verifiers MultiTurnEnv, written as a verifiers user writes one: guess a number from
"higher"/"lower" hints. Loaded by `verifiers.load_environment("tests.env_workers.adapters.vf_guess")`."""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset


def _last_guess(messages) -> str:
    last = [m for m in messages if (m["role"] if isinstance(m, dict) else m.role) == "assistant"][-1]
    return (last["content"] if isinstance(last, dict) else last.content).strip()


class GuessEnv(vf.MultiTurnEnv):
    """Guess a number from 1 to 9; each wrong guess gets a hint."""

    @vf.stop
    async def solved(self, state) -> bool:
        return bool(state["trajectory"]) and _last_guess(state["trajectory"][-1]["completion"]) == state["answer"]

    async def env_response(self, messages, state, **kwargs):
        guess = _last_guess(messages)
        if guess == "explode":
            raise RuntimeError("the hint machine exploded")
        hint = "higher" if guess.isdigit() and int(guess) < int(state["answer"]) else "lower"
        return [vf.UserMessage(content=hint)]


def correct(completion, answer, **kwargs) -> float:
    return 1.0 if _last_guess(completion) == answer else 0.0


def few_turns(state, **kwargs) -> float:
    return 1.0 / max(1, len(state["trajectory"]))


def load_environment(**kwargs) -> vf.Environment:
    rows = [{"question": "Guess my number (1-9). Reply with the number only.", "answer": str(n)} for n in (3, 7, 5)]
    return GuessEnv(dataset=Dataset.from_list(rows), system_prompt="You are playing a guessing game.",
                    rubric=vf.Rubric(funcs=[correct, few_turns], weights=[1.0, 0.5]), max_turns=6)
