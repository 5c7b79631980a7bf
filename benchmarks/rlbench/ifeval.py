"""Instruction-following prompts for the `judge` environment (in the spirit of IFEval).

A seed picks a form, a topic and two constraints of different kinds; the task is an explicit
`judge` task, `{"prompt", "rubric"}`, whose rubric tells the judge to check every
constraint before grading quality. The judge env's own seeded prompts are too few (13
distinct ones) to hold out a test set, so the benchmark brings its own.

    >>> t = task(3)
    >>> sorted(t)
    ['prompt', 'rubric']
    >>> task(3) == t
    True
"""

from __future__ import annotations

import random

_FORMS = ["a short story", "a product description", "an email to a colleague", "a recipe", "a news brief",
          "a packing list", "a motivational note", "a museum label", "a diary entry", "a travel tip"]
_TOPICS = ["a lost umbrella", "the first day of spring", "a broken elevator", "a robot learning to cook",
           "a night train", "a balcony garden", "an old map", "a chess tournament", "a power outage",
           "a new bakery", "a lighthouse keeper", "a rainy football match", "a library cat", "a solar eclipse",
           "a mountain hut", "a street market"]
_WORDS = ["copper", "whisper", "lantern", "orbit", "velvet", "harbor", "pepper", "glacier", "ribbon", "compass"]
_ENDINGS = ["That is all.", "See you soon.", "Any questions?", "The end.", "Stay curious."]


def _constraints(rng: random.Random) -> dict[str, str]:
    """One instance of every constraint kind, by kind."""
    w1, w2 = rng.sample(_WORDS, 2)
    return {
        "sentences": f"Use exactly {rng.randint(2, 5)} sentences.",
        "words": f"Use at most {rng.choice([30, 40, 50, 60, 80])} words.",
        "lowercase": "Write everything in lowercase letters.",
        "ending": f"End with the exact phrase '{rng.choice(_ENDINGS)}'",
        "include": f"Include the words '{w1}' and '{w2}'.",
        "title": "Start with a title wrapped in double angular brackets, like <<title>>.",
        "commas": "Do not use any commas.",
        "bullets": f"Format it as exactly {rng.randint(3, 5)} bullet points, each starting with '- '.",
    }


# Kinds that contradict each other are never drawn together.
_CLASHES = {frozenset({"sentences", "bullets"})}


def task(seed: int) -> dict[str, str]:
    """The judge task of `seed`: a prompt with two constraints and a rubric that names them."""
    rng = random.Random(seed)
    form, topic = rng.choice(_FORMS), rng.choice(_TOPICS)
    options = _constraints(rng)
    kinds = sorted(options)
    while True:
        pair = rng.sample(kinds, 2)
        if frozenset(pair) not in _CLASHES:
            break
    rules = [options[k] for k in pair]
    prompt = f"Write {form} about {topic}. " + " ".join(rules)
    rubric = ("Check each instruction: " + " ".join(f"({i}) {r}" for i, r in enumerate(rules, 1))
              + f" The text must be {form} about {topic}. Give at most 3 if any instruction is broken; "
                "otherwise grade how well it is written.")
    return {"prompt": prompt, "rubric": rubric}
