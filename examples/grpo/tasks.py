"""What the policy learns: an env of the catalog, a task per seed, and the trainer's shaping.

A `TaskSpec` names the env, builds the task for a seed (training seeds are drawn below
10**8, held-out seeds start at 10**9, so the two never meet), says which finished
trajectories count as well-formed (the format bonus goes to those) and gives the sampling
defaults that suit the env.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from env_workers.envs import textworld
from env_workers.envs.problems import word_problem
from wire import Trajectory

HELD_OUT_BASE = 10**9

# Calc: one worked example of the two-turn exchange before every question. SmolLM2 never
# solved a problem from the env's system prompt alone (no reward variance, no signal).
EXAMPLE = ("Example:\nQuestion: Ben has 3 boxes with 4 cards in each. How many cards are there in all?\n"
           "You: calc: 3 * 4\nCalculator: result: 12\nYou: answer: 12\n\nQuestion: ")


@dataclass(frozen=True, slots=True)
class TaskSpec:
    name: str
    env: str
    make: Callable[[int, int], dict]  # (seed, level) -> task
    well_formed: Callable[[Trajectory], float]  # a format score in [0, 1]; the bonus is proportional
    max_tokens: int
    max_turns: int
    format_bonus: float
    well_formed_label: str
    prompts: int  # groups per step
    lr: float


def _calc(seed: int, level: int) -> dict:
    p = word_problem(seed)
    return {"question": EXAMPLE + p["question"], "answer": p["answer"]}


def _calc_well_formed(t: Trajectory) -> bool:
    """A successful tool call, then an answer (the env ends an episode only on an answer).
    Rewarding the tool call alone teaches the model to call it forever."""
    called = any(m.role == "user" and m.content.startswith("result:") for m in t.messages)
    return called and t.state.value == "completed"


def _household(seed: int, level: int) -> dict:
    return {"seed": seed, "level": level}


def _household_well_formed(t: Trajectory) -> float:
    """A quarter for commands the game understood (the share of turns), three quarters for
    picking up the object the goal names: progress toward the goal, not just valid moves
    (with half and half, the policy collapsed onto valid commands that went nowhere)."""
    opening = 1 + len(textworld.EXAMPLE)  # the system prompt, the worked example, the real game's intro
    replies = [m.content for m in t.messages[opening:] if m.role == "user"]
    valid = sum(not r.startswith("Unknown command") for r in replies) / max(len(replies), 1)
    goal = textworld.generate(int(t.task["seed"]), t.task.get("level", 3)).goal[0]  # the env's own world, not its text
    took = any(r.startswith(f"You take the {goal} ") for r in replies)
    return 0.25 * valid + 0.75 * took


def _reasoning_gym(config: dict, examples: int) -> Callable[[int, int], dict]:
    """A reasoning-gym item per seed (its generator's `config`), after `examples` worked
    examples of the same generator as earlier chat turns (the adapter's `examples`)."""
    return lambda seed, level: {"seed": seed, "config": config, "examples": examples}


def _answer_tagged(t: Trajectory) -> bool:
    """The reply put an answer in the tags the scorer reads (right or wrong)."""
    replies = [m.content for m in t.messages if m.role == "assistant"]
    return bool(replies) and re.search(r"<answer>.+?</answer>", replies[-1], re.DOTALL) is not None


# reasoning-gym generators with a config small enough for a 135M model; `python -m
# examples.grpo.probe` measures the base model on each (how the one trained was chosen).
RG_TASKS = {
    "chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
    "basic_arithmetic": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
    "gcd": {"min_value": 1, "max_value": 20},
    "leg_counting": {"min_animals": 1, "max_animals": 1},
    "word_sequence_reversal": {"min_words": 3, "max_words": 3},
    "spell_backward": {"min_word_len": 3, "max_word_len": 4},
    "letter_counting": {"min_words": 1, "max_words": 2},
}

TASKS = {
    "calc": TaskSpec("calc", "calc", _calc, _calc_well_formed, max_tokens=24, max_turns=3, format_bonus=0.2,
                     well_formed_label="calc, then answer", prompts=8, lr=2e-5),
    "household": TaskSpec("household", "textworld", _household, _household_well_formed, max_tokens=12,
                          max_turns=4, format_bonus=0.4, well_formed_label="valid commands, took the object", prompts=6,
                          lr=5e-5),
}
TASKS |= {f"rg-{name}": TaskSpec(f"rg-{name}", f"reasoning_gym:{name}", _reasoning_gym(config, examples=2),
                                 _answer_tagged, max_tokens=24, max_turns=1, format_bonus=0.2,
                                 well_formed_label="answer in tags", prompts=8, lr=2e-5)
          for name, config in RG_TASKS.items()}
