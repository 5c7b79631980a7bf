"""`gymnasium:ID`: a Gymnasium environment, made by `gymnasium.make(ID)`.

`ID` is whatever `gymnasium.make` takes: a registered id (`Namespace/Name-v0`), or
`module:Name-v0`, which imports `module` first, so a package that calls
`gymnasium.register(...)` on import is reachable without our code knowing it.

Spaces, mapped onto chat messages:
- observation `Text`: the string is the user message; `Discrete`: the integer, in decimal.
- action `Text`: the reply, stripped; `Discrete(n, start)`: the last integer in the reply.
  A reply that is not in the action space goes back to the model as text (reward 0, the
  episode goes on; the turn limit bounds it), never a crash.
Any other space answers `EnvUnadaptable` when the name is first used. The system message is
the env's `metadata["system_prompt"]` if it has one, else a line saying what to reply with.
A task is `{"seed": N}`, optionally with `"options": {...}` (passed to `reset`).
"""

from __future__ import annotations

import json
import re
from typing import Any

import gymnasium
from gymnasium import error, spaces

from env_workers.env import EnvError, StepResult
from env_workers.registry import EnvPackageMissing, EnvSpec, EnvUnadaptable, UnknownEnv
from wire import Message

_INT = re.compile(r"-?\d+")


def _make(env_id: str) -> gymnasium.Env:
    return gymnasium.make(env_id, disable_env_checker=True)


def _check_spaces(env_id: str, env: gymnasium.Env) -> None:
    for what, space in (("observation", env.observation_space), ("action", env.action_space)):
        if not isinstance(space, (spaces.Text, spaces.Discrete)):
            raise EnvUnadaptable(f"gymnasium {env_id!r}: its {what} space {space} is neither Text nor Discrete, "
                                 "so it has no text form")


def _obs_text(obs: Any) -> str:
    return obs if isinstance(obs, str) else str(int(obs))


def _jsonable(info: dict) -> dict:
    return json.loads(json.dumps(info, default=str))  # numpy values and the like become text


class GymnasiumEnv:
    def __init__(self, env_id: str) -> None:
        self.env_id = env_id
        self._env = _make(env_id)
        _check_spaces(env_id, self._env)
        self._done = True

    def _system(self) -> str:
        if prompt := self._env.metadata.get("system_prompt"):
            return prompt
        a = self._env.action_space
        if isinstance(a, spaces.Discrete):
            return f"Reply with one action: an integer from {int(a.start)} to {int(a.start) + int(a.n) - 1}."
        return f"Reply with your action: text of at most {a.max_length} characters."

    def reset(self, task: dict[str, Any], seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        n, options = task.get("seed", seed), task.get("options")
        if (n is not None and (not isinstance(n, int) or isinstance(n, bool))) or not isinstance(options, (dict, type(None))):
            raise EnvError(f"a gymnasium task is {{'seed': int, 'options': {{...}}}}, got {task!r}"[:500])
        obs, info = self._env.reset(seed=n, options=options)
        self._done = False
        return [Message(role="system", content=self._system()), Message(role="user", content=_obs_text(obs))], \
            _jsonable(info)

    def _action(self, text: str) -> tuple[Any, str | None]:
        a = self._env.action_space
        if isinstance(a, spaces.Discrete):
            found = _INT.findall(text)
            if not found or not a.contains(int(found[-1])):
                return None, (f"Invalid action. Reply with an integer from {int(a.start)} to "
                              f"{int(a.start) + int(a.n) - 1}.")
            return int(found[-1]), None
        action = text.strip()
        if not a.contains(action):
            return None, (f"Invalid action: it must be {a.min_length} to {a.max_length} characters "
                          "from the environment's character set.")
        return action, None

    def step(self, action: str) -> StepResult:
        if self._done:
            raise EnvError("step() after the episode ended; call reset()")
        act, problem = self._action(action)
        if problem is not None:
            return StepResult([Message(role="user", content=problem)], 0.0, False, False, {"invalid_action": True})
        obs, reward, terminated, truncated, info = self._env.step(act)
        self._done = bool(terminated or truncated)
        observation = [] if self._done else [Message(role="user", content=_obs_text(obs))]
        return StepResult(observation, float(reward), bool(terminated), bool(truncated), _jsonable(info))

    def close(self) -> None:
        self._done = True
        self._env.close()


def names() -> list[str]:
    return sorted(gymnasium.registry)  # only the ids registered so far; `module:ID` finds more


def spec(family: str, env_id: str) -> EnvSpec:
    try:
        env = _make(env_id)
    except (error.NameNotFound, error.NamespaceNotFound, error.VersionNotFound) as e:
        raise UnknownEnv(f"gymnasium has no environment {env_id!r}: {e}") from e
    except ModuleNotFoundError as e:
        raise EnvPackageMissing(f"gymnasium {env_id!r}: the module that registers it is not installed here: {e}") from e
    except error.Error as e:
        raise UnknownEnv(f"gymnasium cannot make {env_id!r}: {e}") from e
    try:
        _check_spaces(env_id, env)
        doc = (type(env.unwrapped).__doc__ or "").strip().splitlines()
    finally:
        env.close()
    return EnvSpec(f"{family}:{env_id}", lambda: GymnasiumEnv(env_id),
                   f"gymnasium {env_id}" + (f": {doc[0]}" if doc else ""), example_tasks=[{"seed": 0}, {"seed": 1}])
