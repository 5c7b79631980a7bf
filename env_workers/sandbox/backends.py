"""Sandbox backends, by name: the plug point for where an episode's tools run.

    bwrap    bubblewrap (the default: rootless, no daemon, works on HPC nodes)
    docker   one container per sandbox, through a Docker API (options: docker_url, image)

The env worker's entry point calls `configure(name, **options)` once, from its settings
(`ROLLOUT_SANDBOX_BACKEND`, `ROLLOUT_SANDBOX_DOCKER_URL`, `ROLLOUT_SANDBOX_IMAGE`); a
`SandboxSpec` that names no backend uses the configured one, so environments never hard-code
theirs. A new backend: a module with a class that has the `Sandbox` protocol's methods, a
builder here, and one line in `BACKENDS` (docs/ARCHITECTURE.md, "Plug points").
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from env_workers.sandbox.base import Limits, Sandbox, SandboxError

Maker = Callable[[Limits], Sandbox]


def _bwrap(**_options: Any) -> Maker:
    from env_workers.sandbox.bwrap import BwrapSandbox

    return BwrapSandbox


def _docker(docker_url: str = "", image: str = "", **_options: Any) -> Maker:
    import docker

    from env_workers.sandbox.docker import DockerSandbox

    if not image:
        raise SandboxError("the docker backend needs an image (ROLLOUT_SANDBOX_IMAGE)")
    client = docker.DockerClient(base_url=docker_url) if docker_url else docker.from_env()
    return lambda limits: DockerSandbox(client, image, limits)


# name -> builder(**options) -> a function from Limits to a new sandbox
BACKENDS: dict[str, Callable[..., Maker]] = {
    "bwrap": _bwrap,
    "docker": _docker,
}

_lock = threading.Lock()
_default = "bwrap"
_options: dict[str, Any] = {}
_built: dict[str, Maker] = {}


def configure(default: str = "bwrap", **options: Any) -> None:
    """Choose the backend of specs that name none, and the options every builder gets."""
    global _default, _options
    if default not in BACKENDS:
        raise ValueError(f"no sandbox backend {default!r}; known: {', '.join(BACKENDS)}")
    with _lock:
        _default, _options = default, dict(options)
        _built.clear()


def maker(name: str | None = None) -> Maker:
    """How to make a sandbox of backend `name` (None: the configured default); built once."""
    with _lock:
        name = name or _default
        if name not in _built:
            try:
                build = BACKENDS[name]
            except KeyError:
                raise SandboxError(f"no sandbox backend {name!r}; known: {', '.join(BACKENDS)}") from None
            _built[name] = build(**_options)
        return _built[name]
