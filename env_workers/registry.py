"""The environment registry: name -> spec -> `make(name)`.

    from env_workers.registry import make
    env = make("calc")
    env = make("swe", resources=pools.claims(session_id))   # an env that uses sandboxes

An `EnvSpec` says whether a recorded episode replays exactly (`nondeterminism`: None, or why
not) and lists the resource specs its environment may acquire (`resources`): the env
worker pre-warms those pools, and hands such an environment a per-episode `Claims`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from env_workers.env import Env


@dataclass(slots=True)
class EnvSpec:
    name: str
    factory: Callable[[], Env]
    description: str
    example_tasks: list[dict[str, Any]] = field(default_factory=list)
    resources: tuple[Any, ...] = ()  # ResourceSpecs it may acquire; then factory(resources=Claims)
    # Why replaying a recorded episode (same task, seed and actions) may not reproduce its
    # observations and rewards; None: it does (`rollout_service.replay`, checked by its tests).
    nondeterminism: str | None = None


_REGISTRY: dict[str, EnvSpec] = {}


def register(spec: EnvSpec) -> None:
    if spec.name in _REGISTRY:
        raise ValueError(f"environment {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec


def spec(name: str) -> EnvSpec:
    _load_builtin()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown environment {name!r}; known: {', '.join(sorted(_REGISTRY))}") from None


def make(name: str, resources: Any = None) -> Env:
    """`resources`: the episode's `env_workers.resources.Claims`; without one, an environment
    that needs sandboxes uses the process-wide default pools."""
    s = spec(name)
    if s.resources and resources is not None:
        return s.factory(resources=resources)
    return s.factory()


def names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def _load_builtin() -> None:
    # Importing the package registers every built-in environment exactly once.
    import env_workers.envs  # noqa: F401
