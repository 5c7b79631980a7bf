"""The environment registry: name -> spec -> `make(name)`.

    from env_workers.registry import make
    env = make("calc")
    env = make("swe", resources=pools.claims(session_id))   # an env that uses sandboxes
    env = make("reasoning_gym:leg_counting")                  # a third-party env (`env_workers/adapters/`)

A name with a colon is `FAMILY:NAME`: the family's adapter resolves it on first use (and
keeps the spec, at most `adapters.CACHED` of them). Resolving raises one of three errors the
env worker answers with a 4xx: `UnknownEnv` (no such family or name), `EnvPackageMissing`
(the family's package is not installed here) or `EnvUnadaptable` (it exists, but its
interface cannot be mapped onto ours).

An `EnvSpec` says whether a recorded episode replays exactly (`nondeterminism`: None, or why
not), whether its calls are cheap enough to run on an event loop (`inline`), and lists the resource specs its environment may acquire (`resources`): the env
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
    # Its reset, step and close are pure computation of microseconds (no sandbox, no I/O, bounded
    # input): an in-process runner calls them on its event loop instead of handing each to a
    # thread, whose handoff (and the GIL it contends for) costs more than the call.
    inline: bool = False

    def __post_init__(self) -> None:
        if self.inline and self.resources:  # a sandbox's calls block: never on an event loop
            raise ValueError(f"env {self.name!r}: an inline env acquires no resources")


class EnvNameError(Exception):
    """A name that does not give an environment here (the base of the three below)."""


class UnknownEnv(EnvNameError, KeyError):
    __str__ = Exception.__str__  # KeyError would quote the message


class EnvPackageMissing(EnvNameError):
    """The family exists but its package is not installed in this env worker."""


class EnvUnadaptable(EnvNameError):
    """The environment exists, but its spaces or interface cannot be mapped onto ours."""


_REGISTRY: dict[str, EnvSpec] = {}


def register(spec: EnvSpec) -> None:
    if spec.name in _REGISTRY:
        raise ValueError(f"environment {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec


def spec(name: str) -> EnvSpec:
    _load_builtin()
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" in name:
        from env_workers import adapters

        return adapters.resolve(name)
    raise UnknownEnv(f"unknown environment {name!r}; known: {', '.join(sorted(_REGISTRY))}, "
                     f"or FAMILY:NAME for {', '.join(_families())}")


def make(name: str, resources: Any = None) -> Env:
    """`resources`: the episode's `env_workers.resources.Claims`; without one, an environment
    that needs sandboxes uses the process-wide default pools."""
    s = spec(name)
    if s.resources and resources is not None:
        return s.factory(resources=resources)
    return s.factory()


def names() -> list[str]:
    """The built-in environments, by name (third-party ones are resolved on use: `hosted`)."""
    _load_builtin()
    return sorted(_REGISTRY)


def hosted() -> list[str]:
    """What an env worker announces: every built-in name, and `FAMILY:*` for each third-party
    family whose package is installed here."""
    from env_workers import adapters

    return names() + [f"{f}:*" for f in adapters.installed()]


def _families() -> list[str]:
    from env_workers import adapters

    return sorted(adapters.FAMILIES)


def _load_builtin() -> None:
    # Importing the package registers every built-in environment exactly once.
    import env_workers.envs  # noqa: F401
