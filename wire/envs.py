"""The env-worker wire: a rollout worker opening, stepping and closing an episode on an env
worker (its `/v1/sessions`, not the gateway's session proxy), and the env worker's announcement of itself."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from wire.base import ENV_NAME_MAX, ENV_NAME_PATTERN, Input, Int, JsonObject, Message, Wire


class WorkerInfo(Input):
    id: str = Field(min_length=1, max_length=128)
    url: str = Field(min_length=1, max_length=512)
    envs: list[str]


class EnvOpen(Input):
    env: str = Field(min_length=1, max_length=ENV_NAME_MAX, pattern=ENV_NAME_PATTERN)
    task: JsonObject
    seed: Int | None = None
    trajectory_id: str | None = Field(None, min_length=1, max_length=200,
                                      description="The trajectory this episode belongs to: it owns the episode's "
                                                  "sandbox leases. None: the env worker names the episode itself.")


class EnvOpened(Wire):
    session_id: str
    observation: list[Message]
    info: dict[str, Any] = Field(default_factory=dict)


class EnvAction(Input):
    action: str = Field(max_length=1_000_000)


class EnvStepped(Wire):
    observation: list[Message]
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any] = Field(default_factory=dict)
