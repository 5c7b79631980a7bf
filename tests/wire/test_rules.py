"""The rules that live on the wire enums: one definition each, read by server, SDK and board."""

from __future__ import annotations

import json

import httpx
import pydantic
import pytest

from wire import EngineInfo, FailureKind, StateRules, TrajectoryState

S, F = TrajectoryState, FailureKind


def test_terminal_and_usable():
    assert {s for s in S if s.terminal} == {S.completed, S.truncated, S.failed, S.cancelled}
    assert {s for s in S if s.usable} == {S.completed, S.truncated}
    rules = StateRules.current()
    assert rules.terminal == [S.completed, S.truncated, S.failed, S.cancelled] and rules.usable == [S.completed,
                                                                                                     S.truncated]


def test_failure_kinds_retry_and_masking():
    assert {k for k in F if k.retryable} == {F.engine, F.env, F.sandbox, F.internal}
    assert {k for k in F if not k.infrastructure} == {F.cancelled, F.rejected}  # the task's or the caller's doing


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "https://vllm.internal/v1", "http://a[b:99999/x",
                                 "http://[abc]:80", "http://[]", "http://]x[:1/[y]", "http://x.y-z_:0/%zz",
                                 "http://127.0.0.1:65535", "http://127.0.0.1:65536", "http://127.0.0.1:99999"])
def test_engine_urls_pass_exactly_when_httpx_can_use_them(url):
    try:  # httpx parses any five-digit port; connecting to one past 65535 raised OverflowError
        u = httpx.URL(url)
        ok = bool(u.host) and (u.port is None or 1 <= u.port <= 65535)
    except (httpx.InvalidURL, ValueError):
        ok = False
    try:
        EngineInfo(id="e", url=url)
        passed = True
    except pydantic.ValidationError:
        passed = False
    assert passed == ok


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_free_form_json_inputs_refuse_nan_and_infinity_and_say_where(bad):
    """A task, an env episode's task and a tool's parameter schema are free-form JSON: any shape,
    but only numbers JSON has (Python's parser reads NaN and Infinity; nothing downstream can send them)."""
    from wire import EnvOpen, RolloutRequest
    from wire.sessions import FunctionDef, FunctionTool

    made = [lambda v: RolloutRequest(tasks=[{"ok": 1.5}, v], env="math"),
            lambda v: EnvOpen(env="math", task=v),
            lambda v: FunctionDef(name="f", parameters=v),
            lambda v: FunctionTool(type="function", name="f", parameters=v)]
    for make in made:
        with pytest.raises(pydantic.ValidationError, match=r"\$\.p\.q\[2\] is .*JSON has no NaN or Infinity"):
            make({"p": {"q": [0.0, "x", bad]}})
        make({"p": {"q": [0.0, "NaN", 1e308, 10**40, True, None]}})  # strings, large numbers, null pass


def test_numpy_values_in_a_task_become_the_python_values_they_hold():
    """`{"seed": np.random.randint(9)}` is an int64, which no JSON encoder takes: the SDK's submit
    failed with pydantic's "Unable to serialize unknown type". NaN inside an array is still refused."""
    import numpy as np

    from trainer_client._client import RolloutClient
    from wire import RolloutRequest

    task = {"seed": np.int64(3), "x": np.float32(1.5), "grid": np.array([[1, 2], [3, 4]]), "tag": "a", "n": [1, None]}
    body = RolloutClient.build([task], "math", 2, None)
    assert body["tasks"] == [{"seed": 3, "x": 1.5, "grid": [[1, 2], [3, 4]], "tag": "a", "n": [1, None]}]
    assert type(body["tasks"][0]["seed"]) is int and json.dumps(body)  # plain JSON, all of it
    with pytest.raises(pydantic.ValidationError, match=r"\$\.a\[1\] is nan"):
        RolloutRequest(tasks=[{"a": np.array([0.5, np.nan])}], env="math")
