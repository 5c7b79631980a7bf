"""`openenv:URL`: an environment served by OpenEnv's own server (`openenv-core`), one
WebSocket session per episode.

OpenEnv's HTTP `/reset` and `/step` build a fresh environment for every call, so an episode
of several steps must hold the server's WebSocket session (`URL/ws`, one environment per
connection): we speak it through the package's own `EnvClient`. The mapping:

    action        the reply's text is the value of the action's one text field: the action
                  schema (`URL/schema`) must have exactly one string property (or exactly one
                  required one), else the name cannot be adapted (a 4xx at submit time)
    observation   its only string property as a user message; with several (or none), the
                  observation's fields as JSON
    task          {"reset": {the env's reset arguments: seed, episode_id, ...},
                   "instructions": "a system message before the first observation"}
    reward, done  the env's own (a step with no reward scores 0.0); done ends the episode

Checked with openenv-core 0.2.0 (newer releases bring gradio or fastmcp; constraints.txt says
which conflict). A server of any release speaking the same protocol works.
Non-goals: OpenEnv's MCP tools, its Docker/HF Space launchers (start the server yourself).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

import httpx
from openenv.core import EnvClient
from openenv.core.client_types import StepResult as OpenEnvStep
from websockets.exceptions import WebSocketException

from env_workers.env import EnvError, EnvUnavailable, StepResult
from env_workers.registry import EnvSpec, EnvUnadaptable, UnknownEnv
from wire import Message

TIMEOUT_S = 60.0


class _Client(EnvClient):
    """OpenEnv's client with our action field and a plain-dict observation."""

    def __init__(self, url: str, action_field: str):
        super().__init__(url, message_timeout_s=TIMEOUT_S)
        self.action_field = action_field

    def _step_payload(self, action: str) -> dict[str, Any]:
        return {self.action_field: action}

    def _parse_result(self, payload: dict[str, Any]) -> OpenEnvStep:
        return OpenEnvStep(observation=payload.get("observation") or {}, reward=payload.get("reward"),
                           done=bool(payload.get("done")))

    def _parse_state(self, payload: dict[str, Any]) -> dict[str, Any]:
        return payload


class OpenEnvEnv:
    def __init__(self, url: str, action_field: str, text_field: str | None) -> None:
        self.url, self.action_field, self.text_field = url, action_field, text_field
        self._client: _Client | None = None
        self._done = True

    def _call(self, fn, *args, **kw) -> OpenEnvStep:
        try:
            return fn(*args, **kw)
        except ConnectionError as e:  # the client's own: the server is not there
            raise EnvUnavailable(f"OpenEnv server {self.url} unreachable: {e}") from e
        except RuntimeError as e:  # the client's: the server answered an error message
            raise EnvError(f"OpenEnv server {self.url}: {e}") from e
        except (OSError, TimeoutError, WebSocketException) as e:  # the connection dropped mid-episode
            raise EnvUnavailable(f"OpenEnv session with {self.url} lost: {e!r}") from e

    def _text(self, obs: dict[str, Any]) -> str:
        if self.text_field is not None and isinstance(obs.get(self.text_field), str):
            return obs[self.text_field]
        return json.dumps(obs, ensure_ascii=False, sort_keys=True)

    def reset(self, task: dict[str, Any], seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        kwargs = task.get("reset", {})
        if not isinstance(kwargs, dict):
            raise EnvError("an openenv task's 'reset' is a dict of the env's reset arguments")
        if seed is not None:
            kwargs = {"seed": seed, **kwargs}
        self.close()
        self._client = _Client(self.url, self.action_field)
        first = self._call(self._client.reset, **kwargs)
        self._done = first.done
        obs = [Message(role="user", content=self._text(first.observation))]
        if isinstance(task.get("instructions"), str):
            obs.insert(0, Message(role="system", content=task["instructions"]))
        return obs, {"observation": first.observation}

    def step(self, action: str) -> StepResult:
        if self._done or self._client is None:
            raise EnvError("step() after the episode ended; call reset()")
        r = self._call(self._client.step, action)
        self._done = r.done
        return StepResult([] if r.done else [Message(role="user", content=self._text(r.observation))],
                          float(r.reward or 0.0), r.done, False, {"observation": r.observation})

    def close(self) -> None:
        self._done = True
        if self._client is not None:
            self._client.disconnect()  # closes the session: the server drops its environment
            self._client = None


def _only_string(schema: dict[str, Any], required_only: bool = False) -> str | None:
    props = schema.get("properties") or {}
    names = [k for k, v in props.items() if isinstance(v, dict) and v.get("type") == "string"
             and k != "metadata" and (not required_only or k in (schema.get("required") or []))]
    return names[0] if len(names) == 1 else None


def names() -> None:
    return None  # any server URL


def spec(family: str, url: str) -> EnvSpec:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UnknownEnv(f"openenv needs an OpenEnv server's http(s) URL, got {url!r}")
    try:
        r = httpx.get(f"{url.rstrip('/')}/schema", timeout=10.0)
        r.raise_for_status()
        schemas = r.json()
        action, observation = schemas["action"], schemas["observation"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
        raise UnknownEnv(f"no OpenEnv server answers at {url} (GET /schema: {e!r})") from None
    field = _only_string(action) or _only_string(action, required_only=True)
    if field is None:
        props = sorted(set(action.get("properties") or {}) - {"metadata"})  # metadata: every OpenEnv action has it
        raise EnvUnadaptable(f"the OpenEnv env at {url} takes actions {props}: not one text field to put "
                             "the model's reply in")
    return EnvSpec(f"{family}:{url}", lambda: OpenEnvEnv(url, field, _only_string(observation)),
                   f"OpenEnv server at {url} ({action.get('title', 'action')}.{field})", example_tasks=[{}])
