"""Real vLLM CPU servers, each set started once for the whole test session: one SmolLM2-135M-
Instruct server, and two tiny-model servers with a KV connector (NixlConnector, both
directions) for prefill/decode tests.

The first run builds the vLLM venv and converts the packaged model (minutes, cached under
~/.cache/rollout-service); `.ci/run` does that step first so its progress shows there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from rollout_service.local import vllm_local
from tests.conftest import free_port


@dataclass
class VLLMServer:
    url: str
    model_dir: Path
    name: str


@pytest.fixture(scope="session")
def vllm_server():
    path = vllm_local.prepare_model("smollm2")
    port = free_port()
    proc = vllm_local.start_server(path, port, "smollm2")
    try:
        vllm_local.wait_ready(f"http://127.0.0.1:{port}", 300, proc)
        yield VLLMServer(f"http://127.0.0.1:{port}", path, "smollm2")
    finally:
        vllm_local.stop_server(proc)


@dataclass
class KVEngines:
    urls: list[str]
    tokenizer: str  # the tiny model's folder


# The KV engines stop as soon as no test left to run needs them: NIXL's UCX progress thread
# polls without sleeping, a core each for as long as they live, and every test after them
# (vLLM turns, HTTP timeouts) ran on a machine with both cores taken.
_kv_engines: list = []


def pytest_runtest_teardown(item, nextitem):
    if not _kv_engines:
        return
    items = item.session.items  # the run's order, after every plugin reordered it
    later = items[items.index(item) + 1:] if item in items else []
    if not any("two_kv_engines" in i.fixturenames for i in later):
        _stop_kv_engines()


def _stop_kv_engines() -> None:
    while _kv_engines:
        vllm_local.stop_server(_kv_engines.pop())


@pytest.fixture(scope="session")
def two_kv_engines():
    """Two tiny-model engines that can take either side of a KV hand-over. `kv_pull_min_tokens=1`:
    a decode engine's KV is read back however short the last response (the tests' responses are
    a few tokens; vLLM's default threshold, 64, would recompute them)."""
    vllm_local.ensure_nixl()
    path = vllm_local.prepare_model("tiny")
    ports = [free_port(), free_port()]
    # one core each: two engines spinning OpenMP threads over the same cores crawl
    cpus = sorted(os.sched_getaffinity(0))
    _kv_engines[:] = [vllm_local.start_server(path, p, "tiny", kv_transfer=True, kv_pull_min_tokens=1,
                                              cpus=str(cpus[i % len(cpus)])) for i, p in enumerate(ports)]
    try:
        for p, proc in zip(ports, _kv_engines):
            vllm_local.wait_ready(f"http://127.0.0.1:{p}", 600, proc)
        yield KVEngines([f"http://127.0.0.1:{p}" for p in ports], str(path))
    finally:
        _stop_kv_engines()
