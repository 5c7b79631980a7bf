"""The rules that live on the wire enums: one definition each, read by server, SDK and board."""

from __future__ import annotations

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
                                 "http://[abc]:80", "http://[]", "http://]x[:1/[y]", "http://x.y-z_:0/%zz"])
def test_engine_urls_pass_exactly_when_httpx_can_use_them(url):
    try:
        ok = bool(httpx.URL(url).host)
    except (httpx.InvalidURL, ValueError):
        ok = False
    try:
        EngineInfo(id="e", url=url)
        passed = True
    except pydantic.ValidationError:
        passed = False
    assert passed == ok
