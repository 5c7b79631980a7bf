"""One real vLLM CPU server (SmolLM2-135M-Instruct) for the whole test session.

The first run builds the vLLM venv and converts the packaged model (minutes, cached under
~/.cache/rollout-service); `.ci/run` does that step first so its progress shows there.
"""

from __future__ import annotations

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
