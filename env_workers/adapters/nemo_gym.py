"""`nemo_gym:URL`: a NeMo Gym resources server verifies the episode's final answer.

A task is one row of a NeMo Gym dataset: `{"responses_create_params": {"input": [...]}, ...}`
plus whatever verifier metadata the server reads. The episode, over the server's HTTP API:

    reset: POST URL/seed_session  {row}                      (its cookies keep the session)
           the observation is `responses_create_params.input` (messages, or one user string)
    step:  POST URL/verify        {row, "response": {...}}  -> {"reward": float, ...}

`response` is an OpenAI Responses object whose output is our reply as one assistant message.
The episode is one turn; the reward is the server's, and its other numeric fields go to
`info["verify"]`. A 4xx from the server means it refused the row (a bad task); a 5xx or a
malformed answer is the env's failure; an unreachable server is an `env_unavailable`.
The `nemo-gym` package needs Python 3.12 or newer, so this adapter speaks the documented API
with httpx rather than importing it. Non-goals: tool calls and MCP sessions.
"""

from __future__ import annotations

import time
import uuid
from typing import Any
from urllib.parse import urlsplit

import httpx

from env_workers.env import EnvError, EnvUnavailable, StepResult
from env_workers.registry import EnvSpec, UnknownEnv
from wire import Message

TIMEOUT_S = 120.0


class NemoGymEnv:
    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self._http: httpx.Client | None = None
        self._row: dict[str, Any] | None = None
        self._done = True

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            r = self._http.post(f"{self.url}/{path}", json=body)
        except httpx.HTTPError as e:
            raise EnvUnavailable(f"NeMo Gym server {self.url} unreachable: {e!r}") from e
        if 400 <= r.status_code < 500:
            raise EnvError(f"NeMo Gym server refused /{path} ({r.status_code}): {r.text[:500]}")
        if r.status_code != 200:
            raise RuntimeError(f"NeMo Gym server answered /{path} with {r.status_code}: {r.text[:500]}")
        return r.json()

    def reset(self, task: dict[str, Any], seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        params = task.get("responses_create_params")
        if not isinstance(params, dict) or not isinstance(params.get("input"), (str, list)):
            raise EnvError("a nemo_gym task is a NeMo Gym row: {'responses_create_params': {'input': ...}, ...}")
        obs = _messages(params["input"])
        self.close()
        self._http = httpx.Client(timeout=httpx.Timeout(TIMEOUT_S, connect=5.0))
        self._post("seed_session", task)
        self._row, self._done = task, False
        return obs, {}

    def step(self, action: str) -> StepResult:
        if self._done:
            raise EnvError("step() after the episode ended; call reset()")
        self._done = True
        params = self._row["responses_create_params"]
        response = {
            "id": f"resp_{uuid.uuid4().hex}", "object": "response", "created_at": time.time(),
            "model": str(params.get("model") or "policy"), "status": "completed",
            "output": [{"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": action, "annotations": []}]}],
            "parallel_tool_calls": params.get("parallel_tool_calls", True),
            "tool_choice": params.get("tool_choice", "auto"), "tools": params.get("tools") or [],
        }
        got = self._post("verify", self._row | {"response": response})
        if not isinstance(got.get("reward"), (int, float)) or isinstance(got["reward"], bool):
            raise RuntimeError(f"NeMo Gym /verify answered no numeric reward: {str(got)[:300]}")
        extra = {k: v for k, v in got.items() if isinstance(v, (bool, int, float)) and k != "reward"}
        return StepResult([], float(got["reward"]), True, False, {"verify": extra})

    def close(self) -> None:
        self._done = True
        if self._http is not None:
            self._http.close()
            self._http = None


def _messages(inp: str | list) -> list[Message]:
    if isinstance(inp, str):
        return [Message(role="user", content=inp)]
    out = []
    for m in inp:
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant"):
            raise EnvError(f"a NeMo Gym input item must be a message with a role, got {str(m)[:200]}")
        content = m.get("content")
        text = content if isinstance(content, str) else "".join(
            p.get("text", "") for p in content or [] if isinstance(p, dict))
        out.append(Message(role="system" if m["role"] == "developer" else m["role"], content=text))
    if not out:
        raise EnvError("a NeMo Gym row's input is empty")
    return out


def names() -> None:
    return None  # any server URL


def spec(family: str, url: str) -> EnvSpec:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UnknownEnv(f"nemo_gym needs a resources server's http(s) URL, got {url!r}")
    return EnvSpec(f"{family}:{url}", lambda: NemoGymEnv(url), f"NeMo Gym resources server at {url}",
                   example_tasks=[])
