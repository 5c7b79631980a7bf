"""Sandboxes as pooled resources: `SandboxSpec` (what to make) and `Box` (what you get).

    SPEC = SandboxSpec(limits=Limits(timeout_s=10))         # scope trajectory, the configured backend
    box = claims.acquire(SPEC)                               # a Box: sandbox + its tools
    box.tools.call("bash", command="ls")

A warm `Box` is a started sandbox whose bash session is already running, so an episode's
first tool call costs about what every later one does. `Scope.global_` boxes are reset
(tools closed, processes killed, workspace emptied) and go back to the warm set; trajectory
boxes are closed. A spec names its backend, or (the usual) none: then the one the env
worker was configured with (`env_workers/sandbox/backends.py`).

`episode_claims()` hands an environment that was built without an env worker (tests,
`check_env`, in-process rollouts) a handle on one process-wide set of pools.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from env_workers.env import SandboxUnavailable
from env_workers.resources import Claims, Pools, PoolSize, ResourceError, ResourceKind, Scope
from env_workers.sandbox import backends
from env_workers.sandbox.base import ExecResult, Limits, Sandbox, SandboxError
from env_workers.tools import Toolbox, ToolFailure, ToolResult


@dataclass(slots=True)
class Box:
    sandbox: Sandbox
    tools: Toolbox


START_S = 120.0  # longest wait for a new sandbox's bash to answer; then the sandbox counts as failed


@dataclass(slots=True, frozen=True)
class SandboxSpec:
    limits: Limits = field(default_factory=Limits)
    backend: str | None = None  # None: the configured default (backends.configure)
    scope: Scope = Scope.trajectory
    warm_bash: bool = True  # start the bash session while warming, not on the first call
    kind: ResourceKind = field(default=ResourceKind.sandbox, init=False)

    def create(self) -> Box:
        sb = backends.maker(self.backend)(self.limits)
        box = Box(sb, Toolbox(sb))
        if self.warm_bash:
            # Our own start-up, not a model's command: the command limit (often a few seconds) is
            # too short for bash to come up on a loaded node, so it gets START_S.
            r = box.tools.call("bash", command="true", timeout_s=max(START_S, self.limits.timeout_s))
            if r.failure is not None:
                box.tools.close()
                sb.close()
                raise SandboxError(f"bash did not start in a new sandbox: {r.text.strip()}")
        return box

    def reset(self, box: Box) -> None:
        box.tools.close()
        reset = getattr(box.sandbox, "reset", None)
        if reset is None:
            raise SandboxError(f"backend {self.backend!r} cannot reset a sandbox")  # the pool destroys it
        reset()
        box.tools = Toolbox(box.sandbox)
        if self.warm_bash and box.tools.call("bash", command="true").failure is not None:
            raise SandboxError("bash did not restart after a reset")

    def destroy(self, box: Box) -> None:
        box.tools.close()
        box.sandbox.close()

    def __str__(self) -> str:
        lim = self.limits
        return f"{self.backend or 'default'}(mem={lim.memory_mb}MB, procs={lim.processes}, timeout={lim.timeout_s:g}s, " \
               f"net={'on' if lim.network else 'off'}, scope={self.scope.value})"


_default: Pools | None = None
_default_lock = threading.Lock()


def default_pools() -> Pools:
    """The process-wide pools for environments built outside an env worker. Small on purpose:
    tests and `check_env` run here, and nothing is warmed until asked for."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Pools(PoolSize(warm=0, cap=64, wait_s=30.0))
        return _default


def episode_claims() -> Claims:
    return default_pools().claims()


class EpisodeSandbox:
    """An environment's sandbox for one episode, acquired on the first tool call.

    Infrastructure trouble (no sandbox within the pool's wait, a start that failed, a sandbox
    that broke) raises `SandboxUnavailable`; the model's own timeouts and crashes come back
    as a `ToolResult` whose `info()` the environment puts into `StepResult.info`."""

    def __init__(self, spec: SandboxSpec, claims: Claims | None = None) -> None:
        self.spec = spec
        self.claims = claims if claims is not None else episode_claims()

    @property
    def acquired(self) -> bool:
        return any(r.spec == self.spec for r in self.claims.held)

    def box(self) -> Box:
        try:
            return self.claims.acquire(self.spec)
        except ResourceError as e:
            raise SandboxUnavailable(str(e)) from e

    def call(self, tool: str, **args) -> ToolResult:
        r = self.box().tools.call(tool, **args)
        if r.failure is ToolFailure.sandbox:
            raise SandboxUnavailable(r.text)
        return r

    def exec(self, argv: list[str], timeout_s: float | None = None, stdin: bytes | None = None) -> ExecResult:
        sb = self.box().sandbox
        try:
            return sb.exec(argv, timeout_s=timeout_s, **({"stdin": stdin} if stdin is not None else {}))
        except SandboxError as e:
            raise SandboxUnavailable(f"sandbox failed: {e}") from e

    def write(self, path: str, data: bytes) -> None:
        try:
            self.box().sandbox.write_file(path, data)
        except (SandboxError, OSError) as e:
            raise SandboxUnavailable(f"could not write {path} into the sandbox: {e}") from e

    def release(self) -> None:
        try:
            self.claims.release()
        except ResourceError as e:
            raise SandboxUnavailable(str(e)) from e


__all__ = ["Box", "SandboxSpec", "default_pools", "episode_claims", "EpisodeSandbox"]
