"""Third-party environment interfaces, each behind one name family: `FAMILY:NAME`.

    reasoning_gym:leg_counting           one reasoning-gym generator, single turn
    reasoning_gym_retry:leg_counting     the same, retried with feedback on a wrong answer
    gymnasium:ID                         `gymnasium.make(ID)` (`module:Name-v0` imports the module
                                         that registers it, as Gymnasium itself does)
    verifiers:MODULE                     `verifiers.load_environment(MODULE)`
    nemo_gym:URL                         a NeMo Gym resources server (`/seed_session`, `/verify`)
    openenv:URL                          an OpenEnv server (`openenv-core`), over its WebSocket session

One module per family; each has `spec(name) -> EnvSpec` (raising the registry's `UnknownEnv`
or `EnvUnadaptable`) and `names() -> list[str] | None` (what it can enumerate, for `rollout
envs`). The family's package is imported only when one of its names is used; a family whose
package is missing answers `EnvPackageMissing`, naming the extra that installs it.

Non-goals: reimplementing any of these packages. Each adapter maps the package's own
objects (its generator and scorer, its `Env`, its rubric, its server) onto our protocol.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
from collections import OrderedDict
from dataclasses import dataclass
from threading import Lock

from env_workers.registry import EnvPackageMissing, EnvSpec, UnknownEnv


@dataclass(slots=True, frozen=True)
class Family:
    module: str  # our adapter, under env_workers.adapters
    imports: str  # the top-level module its package provides ("" = none needed)
    dist: str  # the PyPI distribution, for the error message and `rollout envs`
    description: str


FAMILIES: dict[str, Family] = {
    "reasoning_gym": Family("reasoning_gym", "reasoning_gym", "reasoning-gym",
                            "a reasoning-gym generator, one answer scored by its own scorer"),
    "reasoning_gym_retry": Family("reasoning_gym", "reasoning_gym", "reasoning-gym",
                                  "a reasoning-gym generator; a wrong answer gets feedback and another try"),
    "gymnasium": Family("gymnasium", "gymnasium", "gymnasium",
                        "a Gymnasium env with Text/Discrete spaces, through gymnasium.make"),
    "verifiers": Family("verifiers", "verifiers", "verifiers",
                        "a verifiers SingleTurnEnv/MultiTurnEnv: its env_response and rubric, our sampling"),
    "openenv": Family("openenv", "openenv", "openenv-core",
                      "an OpenEnv server's environment, one WebSocket session per episode"),
    "nemo_gym": Family("nemo_gym", "", "httpx",
                       "a NeMo Gym resources server: the final answer verified by its /verify"),
}
CACHED = 256  # resolved specs kept (names come from requests: bounded, least recently used goes)
_specs: OrderedDict[str, EnvSpec] = OrderedDict()
_lock = Lock()


def installed() -> list[str]:
    """The families whose package is importable here."""
    return sorted(f for f, fam in FAMILIES.items() if not fam.imports or importlib.util.find_spec(fam.imports))


def version(family: str) -> str | None:
    try:
        return importlib.metadata.version(FAMILIES[family].dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def adapter(family: str):
    """The family's adapter module (its package imported), or `EnvPackageMissing`."""
    fam = FAMILIES.get(family)
    if fam is None:
        raise UnknownEnv(f"unknown environment family {family!r}; known: {', '.join(sorted(FAMILIES))}")
    if fam.imports and importlib.util.find_spec(fam.imports) is None:
        raise EnvPackageMissing(f"environment family {family!r} needs the {fam.dist!r} package, not installed "
                                f"in this env worker: pip install 'rollout-service[envs-thirdparty]'")
    return importlib.import_module(f"env_workers.adapters.{fam.module}")


def resolve(name: str) -> EnvSpec:
    """`FAMILY:NAME` -> its spec (cached)."""
    with _lock:
        if name in _specs:
            _specs.move_to_end(name)
            return _specs[name]
    family, _, rest = name.partition(":")
    if not rest:
        raise UnknownEnv(f"environment {name!r} names no {family} environment after the colon")
    s = adapter(family).spec(family, rest)
    with _lock:
        _specs[name] = s
        while len(_specs) > CACHED:
            _specs.popitem(last=False)
    return s
