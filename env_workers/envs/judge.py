"""`judge`: open-ended writing, scored by an LLM judge behind an OpenAI-compatible URL.

Single turn: the model answers a prompt (generated from a seed, or given with an optional
rubric and reference), and a judge rates the answer. The judge is any `Judge` — a function
from chat messages to the judge's text. The env worker configures `OpenAIJudge`: one chat
completion, at temperature 0, from any OpenAI-compatible server (vLLM's, the simulated
engine's, a hosted API) over httpx. Judge text is not training data, so no token ids are
kept and the service's engine code is not involved. Tests inject a deterministic judge.

The judge is asked to end with `score: N` (0 to 10); `parse_score` takes the last such
mark (also `N/10`), and reward = N / 10. A judge that cannot be reached, or whose text has
no score, raises `JudgeUnavailable` (an infrastructure failure of kind `env`, retried
elsewhere): a broken judge must never turn into a reward of 0.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

import httpx

from env_workers.env import EnvError, EnvUnavailable, StepResult
from env_workers.registry import EnvSpec, register
from wire.base import Message

Judge = Callable[[list[Message]], str]

SYSTEM = "Answer the user's request directly and well. Reply with your answer only; it will be graded by a judge."
JUDGE_SYSTEM = (
    "You are a strict grader. Rate the RESPONSE to the REQUEST from 0 (useless) to 10 (excellent), following the "
    "RUBRIC. Think briefly, then end with a last line of the form 'score: N' where N is an integer from 0 to 10."
)
_TOPICS = ["the ocean", "a city at night", "learning to ride a bicycle", "autumn leaves", "a lighthouse", "rain"]
_CONCEPTS = ["recursion", "inflation", "photosynthesis", "a hash table", "gradient descent", "supply and demand"]
_KINDS = [("Write a haiku about {t}.", "Three lines, 5-7-5 syllables, vivid imagery, on topic."),
          ("Explain {c} to a twelve-year-old in at most three sentences.", "Correct, simple, at most three sentences."),
          ("Give two arguments for and two against banning cars from the center of {city}.",
           "Exactly two pros and two cons, concrete and balanced.")]
_SCORE = re.compile(r"score\s*[:=]\s*\**\s*(\d+(?:\.\d+)?)|(\d+(?:\.\d+)?)\s*/\s*10\b", re.I)


class JudgeUnavailable(EnvUnavailable):
    """The judge could not be asked, or did not answer with a score."""


def parse_score(text: str) -> float:
    """The last `score: N` (or `N/10`) in the judge's text, as a reward in [0, 1]."""
    marks = _SCORE.findall(text)
    if not marks:
        raise JudgeUnavailable(f"the judge gave no score (expected 'score: N'); it said: {text[-200:]!r}")
    a, b = marks[-1]
    n = float(a or b)
    if not 0 <= n <= 10:
        raise JudgeUnavailable(f"the judge's score {n:g} is outside 0..10")
    return n / 10


def prompt(seed: int) -> dict[str, str]:
    rng = random.Random(seed)
    text, rubric = rng.choice(_KINDS)
    return {"prompt": text.format(t=rng.choice(_TOPICS), c=rng.choice(_CONCEPTS), city="a large city"),
            "rubric": rubric}


def judge_messages(task: dict[str, str], response: str) -> list[Message]:
    ref = f"\nREFERENCE ANSWER (for guidance):\n{task['reference']}" if task.get("reference") else ""
    return [Message(role="system", content=JUDGE_SYSTEM),
            Message(role="user", content=f"REQUEST:\n{task['prompt']}\n\nRUBRIC:\n{task['rubric']}{ref}\n\n"
                                         f"RESPONSE:\n{response}\n\nGrade it now; end with 'score: N'.")]


class OpenAIJudge:
    """Asks `POST {base_url}/chat/completions`. Synchronous (environments are); one client,
    kept for the life of the judge, so calls reuse connections.

        judge = OpenAIJudge("http://127.0.0.1:8000/v1", model="judge")
        text = judge(judge_messages({"prompt": "Name a prime.", "rubric": "Any prime."}, "7"))
    """

    def __init__(self, base_url: str, model: str = "default", max_tokens: int = 256, timeout_s: float = 120.0,
                 api_key: str | None = None, transport: httpx.BaseTransport | None = None) -> None:
        self.url, self.model, self.max_tokens = base_url.rstrip("/") + "/chat/completions", model, max_tokens
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=5.0), headers=headers, transport=transport)

    def __call__(self, messages: list[Message]) -> str:
        body = {"model": self.model, "messages": [m.model_dump() for m in messages], "temperature": 0.0,
                "max_tokens": self.max_tokens}
        try:
            r = self._http.post(self.url, json=body)
        except httpx.HTTPError as e:
            raise JudgeUnavailable(f"no judge reachable at {self.url}: {e!r}") from e
        if r.status_code != 200:
            raise JudgeUnavailable(f"the judge answered {r.status_code}: {r.text[:300]}")
        try:
            return str(r.json()["choices"][0]["message"]["content"] or "")
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise JudgeUnavailable(f"the judge's answer is not a chat completion: {r.text[:300]}") from e

    def close(self) -> None:
        self._http.close()


_default_judge: Judge | None = None


def configure(judge: Judge | None) -> None:
    """Set the judge used by environments built without one (the env worker does, at start)."""
    global _default_judge
    _default_judge = judge


class JudgeEnv:
    def __init__(self, judge: Judge | None = None) -> None:
        self._judge = judge
        self._task: dict[str, str] = {}
        self._done = True

    def reset(self, task: dict[str, Any], seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        if "seed" in task:
            self._task = prompt(int(task["seed"]))
        elif "prompt" in task:
            self._task = {"prompt": str(task["prompt"]), "rubric": str(task.get("rubric") or "Helpful, correct, concise."),
                          "reference": str(task.get("reference") or "")}
        else:
            raise EnvError("a judge task needs 'seed' or 'prompt' (with optional 'rubric', 'reference')")
        self._done = False
        return [Message(role="system", content=SYSTEM), Message(role="user", content=self._task["prompt"])], {}

    def step(self, action: str) -> StepResult:
        if self._done:
            raise EnvError("step() after the episode ended; call reset()")
        judge = self._judge or _default_judge
        if judge is None:
            raise JudgeUnavailable("no judge configured: start the env worker with --judge-url, or pass judge=")
        try:
            verdict = judge(judge_messages(self._task, action))
        except JudgeUnavailable:
            raise
        except Exception as e:  # noqa: BLE001 - whatever the judge's transport raised
            raise JudgeUnavailable(f"the judge failed: {e!r}") from e
        reward = parse_score(verdict)
        self._done = True
        return StepResult([], reward, True, False, {"judge": verdict[-500:]})

    def close(self) -> None:
        self._done = True


register(EnvSpec("judge", JudgeEnv, "open-ended answers scored 0-10 by an LLM judge (an OpenAI-compatible URL)",
                 example_tasks=[{"seed": 0}, {"prompt": "Name a prime number.", "rubric": "Any prime is correct."}],
                 nondeterminism="the reward is another model's answer: it replays only against the same judge "
                                "model and server (temperature 0 on a deterministic engine); a changed or sampling "
                                "judge scores differently"))
