"""How a rollout worker reaches environments: over HTTP (`RemoteEnvs`, the service) or
in-process (`LocalEnvs`, tests and the simulator). Both raise `EnvUnavailable` for
infrastructure trouble (`SandboxUnavailable`, a subclass, when the trouble was a sandbox);
a 422 from the env (bad task) raises `EnvRejected`."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

import httpx

from env_workers import registry
from env_workers.env import Env, EnvError, EnvUnavailable, SandboxUnavailable, StepResult, checked_step
from wire.base import Message
from wire.envs import EnvOpened, EnvStepped

__all__ = ["EnvBackend", "EnvHandle", "EnvRejected", "EnvUnavailable", "EnvWorkerLost", "LocalEnvs", "RemoteEnvs",
           "SandboxUnavailable", "refused_env"]


def _code(r: httpx.Response) -> str | None:
    try:
        return r.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


def _message(r: httpx.Response) -> str:
    try:
        return r.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return r.text[:300]


class EnvRejected(Exception):
    """The environment refused the task or action (its own error); not retryable."""


class EnvWorkerLost(EnvUnavailable):
    """The env worker holding (or meant to hold) the session is gone: unreachable, restarted
    (it no longer knows the session), or none is live. Our fault, not the trajectory's: the
    rollout worker restarts the episode without charging its attempts."""


@dataclass(slots=True)
class EnvHandle:
    session_id: str
    base_url: str  # "" for in-process


class EnvBackend(Protocol):
    async def open(self, env: str, task: dict[str, Any], seed: int | None,
                   trajectory_id: str | None = None) -> tuple[EnvHandle, list[Message]]:
        """`trajectory_id`: the trajectory the episode belongs to; an env worker makes it the
        owner of the episode's sandbox leases."""
    async def step(self, h: EnvHandle, action: str) -> StepResult: ...
    async def close(self, h: EnvHandle) -> None: ...


class LocalEnvs:
    """Environments in this process. Their (blocking) calls run in threads, so a sandboxed
    step never stalls the event loop that heartbeats leases; an environment whose calls are
    pure computation of microseconds (`EnvSpec.inline`) is called on the loop itself."""

    def __init__(self) -> None:
        self._envs: dict[str, tuple[Env, bool]] = {}  # session -> (environment, inline)
        self._ids = itertools.count()  # session ids are keys of this process only

    async def open(self, env: str, task: dict[str, Any], seed: int | None,
                   trajectory_id: str | None = None) -> tuple[EnvHandle, list[Message]]:
        e = registry.make(env)  # sandboxes come from the process-wide pools (`episode_claims`)
        inline = registry.spec(env).inline
        try:
            obs, _ = await _call(inline, e.reset, task, seed)
        except EnvError as err:
            raise EnvRejected(str(err)) from err
        sid = f"local-{next(self._ids)}"
        self._envs[sid] = (e, inline)
        return EnvHandle(sid, ""), obs

    async def step(self, h: EnvHandle, action: str) -> StepResult:
        e, inline = self._envs[h.session_id]
        try:
            return checked_step(await _call(inline, e.step, action))
        except EnvError as err:
            raise EnvRejected(str(err)) from err

    async def close(self, h: EnvHandle) -> None:
        e, inline = self._envs.pop(h.session_id, (None, False))
        if e is not None:
            await _call(inline, e.close)


async def _call(inline: bool, fn, *args):
    return fn(*args) if inline else await asyncio.to_thread(fn, *args)


async def refused_env(client: httpx.AsyncClient, base_url: str, env: str) -> tuple[str, str] | None:
    """Ask the env worker at `base_url` whether it can run `env`: (error code, message) when it
    cannot (an unknown `FAMILY:NAME`, a package missing), None when it can. EnvWorkerLost when
    it did not say (unreachable, slow, another answer)."""
    try:
        r = await client.get(f"{base_url}/v1/envs/{quote(env, safe='')}")
    except httpx.HTTPError as e:
        raise EnvWorkerLost(f"env worker unreachable: {e!r}") from e
    if r.status_code == 200:
        return None
    if r.status_code in (404, 422) and _code(r) in ("not_found", "env_package_missing", "env_unadaptable"):
        return _code(r), _message(r)
    raise EnvWorkerLost(f"env worker answered {r.status_code}: {r.text[:300]}")


class RemoteEnvs:
    """Talks to env workers; `pick(env)` chooses the worker URL for a new session."""

    def __init__(self, pick, client: httpx.AsyncClient | None = None, timeout_s: float = 120.0):
        # async (env name) -> base url; raises LookupError while no live worker hosts the env
        # (transient), ValueError when none ever did (the env does not exist)
        self._pick = pick
        self._client = client or httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=5.0))

    async def _post(self, url: str, body: dict, session: bool = False) -> dict:
        try:
            r = await self._client.post(url, json=body)
        except httpx.HTTPError as e:
            raise EnvWorkerLost(f"env worker unreachable: {e!r}") from e
        if session and r.status_code == 404:  # the worker restarted: its sessions died with it
            raise EnvWorkerLost(f"env worker lost the session: {r.text[:300]}")
        if r.status_code == 422 or (r.status_code == 404 and not session):  # bad task, or no such env here
            raise EnvRejected(_message(r))
        if r.status_code == 503 and _code(r) == "sandbox_unavailable":
            raise SandboxUnavailable(_message(r))
        if r.status_code == 502 and _code(r) == "env_crashed":  # the environment's own code failed
            raise EnvUnavailable(_message(r))
        if r.status_code != 200:
            raise EnvUnavailable(f"env worker answered {r.status_code}: {r.text[:300]}")
        return r.json()

    async def open(self, env: str, task: dict[str, Any], seed: int | None,
                   trajectory_id: str | None = None) -> tuple[EnvHandle, list[Message]]:
        try:
            base = await self._pick(env)
        except ValueError as e:  # no such environment anywhere: bad input
            raise EnvRejected(str(e)) from e
        except LookupError as e:  # its env workers are down or restarting
            raise EnvWorkerLost(str(e)) from e
        body = {"env": env, "task": task, "seed": seed} | ({"trajectory_id": trajectory_id} if trajectory_id else {})
        got = EnvOpened.model_validate(await self._post(f"{base}/v1/sessions", body))
        return EnvHandle(got.session_id, base), got.observation

    async def step(self, h: EnvHandle, action: str) -> StepResult:
        got = EnvStepped.model_validate(await self._post(f"{h.base_url}/v1/sessions/{h.session_id}/step",
                                                         {"action": action}, session=True))
        return StepResult(got.observation, got.reward, got.terminated, got.truncated, got.info)

    async def close(self, h: EnvHandle) -> None:
        try:
            await self._client.delete(f"{h.base_url}/v1/sessions/{h.session_id}")
        except httpx.HTTPError:
            pass  # the worker's idle reaper closes it

    async def aclose(self) -> None:
        await self._client.aclose()
