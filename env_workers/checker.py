"""`check_env`: the conformance checker every registered environment passes in CI.

It checks the protocol's shapes and types, determinism of `reset` for a given task and
seed, that an episode ends within a bounded number of steps for a fixed action, and that
stepping a finished episode raises `EnvError` rather than silently continuing.
"""

from __future__ import annotations

import math
from typing import Any

from env_workers.env import Env, EnvError, StepResult
from env_workers.registry import spec as get_spec
from wire import Message


class EnvCheckError(AssertionError):
    pass


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise EnvCheckError(msg)


def _check_messages(obs: Any, where: str, allow_empty: bool) -> None:
    _check(isinstance(obs, list), f"{where}: observation must be a list of Message, got {type(obs).__name__}")
    _check(allow_empty or len(obs) > 0, f"{where}: observation must not be empty")
    for m in obs:
        _check(isinstance(m, Message), f"{where}: observation items must be Message, got {type(m).__name__}")


def check_env(name: str, actions: tuple[str, ...] = ("answer: 0", "calc: 1 + 1", "hello"), max_steps: int = 64) -> None:
    s = get_spec(name)
    _check(len(s.example_tasks) > 0, f"{name}: spec needs at least one example task")
    for task in s.example_tasks:
        a, b = s.factory(), s.factory()
        obs_a, info_a = a.reset(task, seed=0)
        obs_b, _ = b.reset(task, seed=0)
        _check_messages(obs_a, f"{name}.reset", allow_empty=False)
        _check(isinstance(info_a, dict), f"{name}.reset: info must be a dict")
        _check(obs_a == obs_b, f"{name}.reset: not deterministic for the same task and seed")
        for action in actions:
            env: Env = s.factory()
            env.reset(task, seed=0)
            _run_episode(name, env, action, max_steps)
            env.close()


def _run_episode(name: str, env: Env, action: str, max_steps: int) -> None:
    for _ in range(max_steps):
        r = env.step(action)
        _check(isinstance(r, StepResult), f"{name}.step must return StepResult")
        _check_messages(r.observation, f"{name}.step", allow_empty=True)
        _check(isinstance(r.reward, float) and math.isfinite(r.reward), f"{name}.step: reward must be a finite float")
        _check(isinstance(r.terminated, bool) and isinstance(r.truncated, bool), f"{name}.step: flags must be bool")
        _check(isinstance(r.info, dict), f"{name}.step: info must be a dict")
        if r.terminated or r.truncated:
            try:
                env.step(action)
            except EnvError:
                return
            raise EnvCheckError(f"{name}.step after the end must raise EnvError")
        _check(len(r.observation) > 0, f"{name}.step: a continuing episode must return an observation")
    # Not ending is allowed (the worker's max_turns truncates), but must stay well-formed.
