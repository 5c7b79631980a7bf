"""The garbage-collector set-up every long-running process of the service makes at start."""

import json
import subprocess
import sys
import types

import pytest

from rollout_service import logs, runtime
from rollout_service.cli import processes


def test_tune_gc_freezes_what_is_loaded_and_raises_the_young_threshold():
    # In a process of its own: the test process's collector stays as it was.
    code = ("import gc, json; from rollout_service.app import create_app; from rollout_service.runtime import tune_gc; "
            "before = (gc.get_freeze_count(), gc.get_threshold()); tune_gc(); "
            "print(json.dumps([before, [gc.get_freeze_count(), gc.get_threshold()]]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    (frozen0, thr0), (frozen, thr) = json.loads(out)
    assert frozen0 == 0 and thr0[0] == 700  # Python's defaults
    assert frozen > 10_000  # the loaded modules, schemas and app: out of every later collection
    assert thr == [runtime.GC_YOUNG, thr0[1], thr0[2]]


class _Called(Exception):
    pass


@pytest.mark.parametrize("command", [processes.cmd_worker, processes.cmd_gateway])
def test_the_worker_and_gateway_tune_their_collector_before_serving(command, monkeypatch):
    def called():
        raise _Called

    monkeypatch.setattr(runtime, "tune_gc", called)
    monkeypatch.setattr(logs, "configure", lambda *a, **k: None)  # (the test process keeps its logging)
    monkeypatch.setattr("uvicorn.run", lambda *a, **k: pytest.fail("served before tuning its collector"))
    monkeypatch.setattr("asyncio.run", lambda *a, **k: pytest.fail("served before tuning its collector"))
    with pytest.raises(_Called):
        command(types.SimpleNamespace(host="127.0.0.1", port=0, concurrency=1, id=None))
