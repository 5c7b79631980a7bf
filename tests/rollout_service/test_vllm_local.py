"""The local vLLM's command line: the dtype follows the CPU (or the override)."""

from __future__ import annotations

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
