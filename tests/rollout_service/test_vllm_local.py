"""The local vLLM's command line: the dtype follows the CPU (or the override); threads follow its cores."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from rollout_service.local import vllm_local


def test_dtype_follows_native_bf16_support(monkeypatch):
    monkeypatch.delenv("ROLLOUT_VLLM_DTYPE", raising=False)
    flags = Path("/proc/cpuinfo").read_text()
    native = "avx512_bf16" in flags or "amx_bf16" in flags
    assert vllm_local.default_dtype() == ("bfloat16" if native else "float32")


def test_dtype_override_reaches_the_command_line(monkeypatch):
    monkeypatch.setenv("ROLLOUT_VLLM_DTYPE", "bfloat16")
    argv, _ = vllm_local.serve_command("/models/m", 8000, "m")
    assert argv[argv.index("--dtype") + 1] == "bfloat16"
    argv, _ = vllm_local.serve_command("/models/m", 8000, "m", dtype="float32")
    assert argv[argv.index("--dtype") + 1] == "float32"


def test_an_engine_runs_as_many_threads_as_it_has_cores():
    _, env = vllm_local.serve_command("/models/m", 8000, "m", cpus="1")
    assert (env["VLLM_CPU_OMP_THREADS_BIND"], env["OMP_NUM_THREADS"]) == ("1", "1")
    _, env = vllm_local.serve_command("/models/m", 8000, "m", cpus="0-3,8,10-11")
    assert env["OMP_NUM_THREADS"] == "7"
    _, env = vllm_local.serve_command("/models/m", 8000, "m")  # every core this process may use
    assert env["OMP_NUM_THREADS"] == str(len(os.sched_getaffinity(0)))


def test_the_kv_side_channel_port_is_free_even_where_the_derived_one_is_taken():
    with socket.socket() as api, socket.socket() as taken:
        api.bind(("127.0.0.1", 0))
        port = api.getsockname()[1]
        derived = port + 10_000 if port < 55_000 else port - 10_000
        try:
            taken.bind(("127.0.0.1", derived))
        except OSError:
            pass  # taken already, by something else
        taken.listen()
        for side in (vllm_local.kv_side_channel_port(port),
                     int(vllm_local.serve_command("/models/m", port, "m", kv_transfer=True)[1]
                         ["VLLM_NIXL_SIDE_CHANNEL_PORT"])):
            assert side not in (port, derived)
            with socket.socket() as s:
                s.bind(("127.0.0.1", side))  # really free
