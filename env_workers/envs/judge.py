"""`judge`: open-ended writing, scored by an LLM judge called through the engine fleet.

Single turn: the model answers a prompt (generated from a seed, or given with an optional
rubric and reference), and a judge rates the answer. The judge is any `Judge` — a function
from chat messages to the judge's text. By default it is `EngineJudge`: it finds an engine
in the service registry (Redis), renders the judge's chat with that engine's tokenizer and
calls it through `VLLMEngine.generate`, at temperature 0. Tests inject a deterministic one.

The judge is asked to end with `score: N` (0 to 10); `parse_score` takes the last such
mark (also `N/10`), and reward = N / 10. A judge that cannot be reached, or whose text has
no score, raises `JudgeUnavailable` (an infrastructure failure of kind `env`, retried
elsewhere): a broken judge must never turn into a reward of 0.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import re
import uuid
from collections.abc import Callable
from typing import Any

from env_workers.env import EnvError, EnvUnavailable, StepResult
from env_workers.registry import EnvSpec, register
from rollout_service.protocol import Message

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


class EngineJudge:
    """Asks an engine of the fleet, found in the registry. Synchronous (environments are)."""

    def __init__(self, redis_url: str, prefix: str = "rs:", max_tokens: int = 256, timeout_s: float = 120.0) -> None:
        self.redis_url, self.prefix, self.max_tokens, self.timeout_s = redis_url, prefix, max_tokens, timeout_s

    def __call__(self, messages: list[Message]) -> str:
        # Our own thread and event loop: the caller may be inside one (in-process envs).
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            return ex.submit(asyncio.run, self._ask(messages)).result()

    async def _ask(self, messages: list[Message]) -> str:
        """One greedy completion from the fleet (routing, health and failover included)."""
        import redis.asyncio as aioredis
        from redis.exceptions import RedisError

        from rollout_service.engines.base import EngineError, GenerateRequest
        from rollout_service.engines.fleet import Fleet
        from rollout_service.protocol import SamplingParams
        from rollout_service.tokens import chat_tokens
        from scheduler.keys import Keys
        from scheduler.registry import Registry

        r = aioredis.from_url(self.redis_url)
        fleet = Fleet(registry=Registry(r, Keys(self.prefix)))
        tid = f"judge-{uuid.uuid4().hex}"
        try:
            async with asyncio.timeout(self.timeout_s):
                spec, tok = await fleet.tokenizer_for(tid)
                req = GenerateRequest(chat_tokens(tok).prompt(messages),
                                      SamplingParams(temperature=0.0, max_tokens=self.max_tokens), tid, [tok.eos_id])
                out = await fleet.generate(tid, spec, req)
        except EngineError as e:
            raise JudgeUnavailable(f"the judge engine failed: {e}") from e
        except (RedisError, OSError, TimeoutError) as e:
            raise JudgeUnavailable(f"no judge reachable: {e!r}") from e
        finally:
            await fleet.aclose()
            await r.aclose()
        ids = out.output_ids[:-1] if out.output_ids[-1:] == [tok.eos_id] else out.output_ids
        return tok.decode(ids)


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
            raise JudgeUnavailable("no judge configured: start the env worker with a Redis URL, or pass judge=")
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


register(EnvSpec("judge", JudgeEnv, "open-ended answers scored 0-10 by an LLM judge from the engine fleet",
                 example_tasks=[{"seed": 0}, {"prompt": "Name a prime number.", "rubric": "Any prime is correct."}]))
