"""`verifiers:MODULE`: a verifiers environment (`SingleTurnEnv`, `MultiTurnEnv`, ...) loaded
with the package's own `load_environment(MODULE)`, its rollout loop driven by our engine.

verifiers runs an episode as `env.rollout(input, client, ...)`, calling `client.get_response`
for every model turn, then scores it with `env.rubric`. We run exactly that, unchanged, on a
thread of its own, with a `client` that samples nothing: it hands each prompt to our `step`
and answers with the action our engine sampled. So the env's own `setup_state`,
`env_response`, stop conditions and rubric run; the tokens are ours (the rollout worker
records what the engine sampled; verifiers only sees the text).

A task is `{"index": I}` (row I of the env's dataset; `"split": "eval"` for its eval set) or
`{"seed": N}` (row N modulo the dataset's size). The episode's reward is the rubric's weighted
sum, given on the last step; `info["metrics"]` has every reward function's own value.
A `vf.Error` inside the rollout is data, as in verifiers (the rubric still scores the
episode, `info["error"]` says what); any other exception is the env's failure.
Every verifiers `Environment` installs process-wide SIGINT/SIGTERM handlers and an `atexit`
hook when it is built (and refuses to be built off the main thread because of it): in an env
worker that would take the server's own signal handling and leak one hook per session. We
give that one module inert `signal`/`atexit` names instead, and run the env's teardown
handlers ourselves when its session closes.
Non-goals: tool calls (text in, text out only) and group-level rubrics.
"""

from __future__ import annotations

import asyncio
import queue
import signal
import threading
import time
import uuid
from types import SimpleNamespace
from typing import Any

import verifiers as vf
import verifiers.legacy.envs.environment as _vf_environment
from verifiers.clients import Client
from verifiers.types import Response, ResponseMessage

from env_workers.env import EnvError, StepResult
from env_workers.registry import EnvPackageMissing, EnvSpec, EnvUnadaptable
from wire import Message

_vf_environment.signal = SimpleNamespace(signal=lambda *a, **k: None, SIGINT=signal.SIGINT, SIGTERM=signal.SIGTERM,
                                         default_int_handler=signal.default_int_handler)
_vf_environment.atexit = SimpleNamespace(register=lambda *a, **k: None)
WAIT_S = 600.0  # the longest a turn waits for the other side (the env worker reaps idle sessions after as long)


class _Stop(Exception):
    """Our episode ended early (closed, truncated by the turn limit): end verifiers' loop."""


class _Bridge(Client):
    """verifiers' model client, answered by whoever calls `EpisodeThread.act`."""

    def __init__(self, events: queue.Queue, actions: queue.Queue) -> None:
        super().__init__(None)
        self._events, self._actions = events, actions

    def setup_client(self, config):  # never called: built from no config
        return None

    async def to_native_tool(self, tool):
        raise vf.Error("tool calls are not supported by the rollout-service verifiers adapter")

    async def to_native_prompt(self, messages):
        return messages, {}

    async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs):
        self._events.put(("prompt", prompt))
        action = await asyncio.get_running_loop().run_in_executor(None, self._take)
        if action is None:
            raise _Stop()
        return action

    def _take(self) -> str | None:
        try:
            return self._actions.get(timeout=WAIT_S)
        except queue.Empty:
            return None

    async def raise_from_native_response(self, response) -> None:
        return None

    async def from_native_response(self, text: str) -> Response:
        return Response(id=uuid.uuid4().hex, created=int(time.time()), model="policy",
                        message=ResponseMessage(content=text, finish_reason="stop", is_truncated=False))

    async def get_response(self, prompt, model, sampling_args, tools=None, **kwargs) -> Response:
        native = await self.get_native_response(prompt, model, sampling_args, tools)
        return await self.from_native_response(native)

    async def close(self) -> None:
        return None


def _text(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(p.get("text", "") if isinstance(p, dict) else str(getattr(p, "text", "")) for p in content)


def _messages(msgs: list) -> list[Message]:
    out = []
    for m in msgs:
        role, content = (m["role"], m.get("content")) if isinstance(m, dict) else (m.role, m.content)
        out.append(Message(role=role if role in ("system", "user", "assistant") else "user", content=_text(content)))
    return out


class VerifiersEnv:
    def __init__(self, module: str) -> None:
        self.module = module
        self._env = _load(module)
        self._events: queue.Queue = queue.Queue()
        self._actions: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._shown = 0  # messages of verifiers' conversation already shown to the model
        self._done = True

    def _row(self, task: dict[str, Any]) -> dict[str, Any]:
        split = task.get("split", "train")
        data = self._env.get_eval_dataset() if split == "eval" else self._env.get_dataset()
        i = task.get("index", task.get("seed"))
        if not isinstance(i, int) or isinstance(i, bool) or split not in ("train", "eval"):
            raise EnvError(f"a verifiers task is {{'index': int}} or {{'seed': int}}, with 'split': train|eval; "
                           f"got {task!r}"[:500])
        if "index" in task and not 0 <= i < len(data):
            raise EnvError(f"index {i} is outside {self.module}'s {split} set of {len(data)} rows")
        return dict(data[i % len(data)])

    def reset(self, task: dict[str, Any], seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        self.close()
        row = self._row(task)
        self._events, self._actions = queue.Queue(), queue.Queue()
        bridge = _Bridge(self._events, self._actions)

        def run() -> None:
            try:
                state = asyncio.run(self._env._run_rollout_state(row, bridge, "policy", {}))
                self._events.put(("done", state))
            except BaseException as e:  # noqa: BLE001 - handed to the caller, raised there
                self._events.put(("raised", e))

        self._thread = threading.Thread(target=run, name=f"verifiers-{self.module}", daemon=True)
        self._thread.start()
        kind, got = self._next()
        if kind != "prompt":
            raise EnvError(f"{self.module} ended its episode before the first turn: {got!r}"[:500])
        self._shown, self._done = len(got), False
        return _messages(got), {"example_id": row.get("example_id")}

    def _next(self) -> tuple[str, Any]:
        try:
            kind, got = self._events.get(timeout=WAIT_S)
        except queue.Empty:
            raise TimeoutError(f"verifiers {self.module} did not answer within {WAIT_S}s") from None
        if kind == "raised":
            self._done = True
            raise got
        return kind, got

    def step(self, action: str) -> StepResult:
        if self._done:
            raise EnvError("step() after the episode ended; call reset()")
        self._actions.put(action)
        kind, got = self._next()
        if kind == "prompt":  # verifiers' conversation so far: ours, our reply, then its env_response
            new = got[self._shown + 1:]
            self._shown = len(got)
            return StepResult(_messages(new), 0.0, False, False, {})
        self._done = True
        state = got
        error = state.get("error")
        info = {"metrics": {k: float(v) for k, v in (state.get("metrics") or {}).items()},
                "stop": state.get("stop_condition"), "error": None if error is None else repr(error)}
        return StepResult([], float(state.get("reward") or 0.0), True, False, info)

    def close(self) -> None:
        self._done = True
        if self._thread is not None:
            if self._thread.is_alive():
                self._actions.put(None)  # the bridge raises _Stop: verifiers' loop ends and cleans up
                self._thread.join(timeout=30.0)
            asyncio.run(self._env._teardown())  # what its atexit hook would have done
        self._thread = None


def _load(module: str):
    try:
        env = vf.load_environment(module)
    except ValueError as e:
        if "Could not import" in str(e):
            raise EnvPackageMissing(f"verifiers environment {module!r} is not installed here: {e}") from e
        raise
    if not isinstance(env, vf.MultiTurnEnv):
        raise EnvUnadaptable(f"verifiers {module!r} is a {type(env).__name__}; only MultiTurnEnv and its "
                             "subclasses (SingleTurnEnv, ...) run here")
    return env


def names() -> None:
    return None  # any importable module with `load_environment`


def spec(family: str, module: str) -> EnvSpec:
    env = _load(module)
    try:
        env.get_dataset()
    except ValueError as e:
        raise EnvUnadaptable(f"verifiers {module!r} has no dataset to draw tasks from: {e}") from e
    doc = (type(env).__doc__ or "").strip().splitlines()
    return EnvSpec(f"{family}:{module}", lambda: VerifiersEnv(module),
                   f"verifiers {module}" + (f": {doc[0]}" if doc else ""),
                   example_tasks=[{"index": 0}, {"seed": 1}])
