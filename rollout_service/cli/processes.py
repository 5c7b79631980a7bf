"""`rollout` commands that run a process of the service until stopped: `gateway`, `worker`,
`allocator`, `env-worker`, `sim-engine`, `up` (all of them here) and `engine` (a local CPU
vLLM). Each reads its `Settings` once, here at the edge, and hands small values down.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from rollout_service.cli._console import console
from rollout_service.config import Settings


def cmd_gateway(args) -> None:
    import uvicorn

    from rollout_service import logs
    from rollout_service.app import create_app
    from rollout_service.runtime import tune_gc

    logs.configure("gateway")
    s = Settings.from_env(host=args.host, port=args.port)
    app = create_app(s)
    tune_gc()
    uvicorn.run(app, host=s.host, port=s.port, log_level="warning", log_config=None)


def cmd_worker(args) -> None:
    from env_workers.client import RemoteEnvs
    from rollout_service.engines.fleet import Fleet
    from rollout_service.runtime import tune_gc
    from rollout_service.worker import Worker
    from scheduler.connection import connect
    from scheduler.keys import Keys
    from scheduler.queue import Queue
    from scheduler.registry import Registry
    from scheduler.results import result_store
    from scheduler.router import make_policy
    from scheduler.store import Store

    s = Settings.from_env()
    from rollout_service import logs

    logs.configure("worker")
    policy = make_policy(s.routing)  # an unknown name fails here, at start
    tune_gc()

    async def main() -> None:
        r = connect(s.redis_url)
        keys = Keys(s.key_prefix)
        reg = Registry(r, keys)
        results = result_store(s.result_store)
        worker = Worker(Queue(r, keys, s.lease_s, s.max_attempts, s.max_restarts, results=results),
                        Store(r, keys, results),
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
        config = AllocatorConfig(dwell_s=args.dwell_s, estimate=args.estimate)
        ctl = PDController(Registry(r, Keys(s.key_prefix)), config=config, move_sizes=args.move_sizes,
                           measure=True)  # speed measured from the turns workers report, not a prior
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        logging.info("allocator started", extra={"every_s": args.every_s})
        await ctl.run(stop, args.every_s)

    asyncio.run(main())


def configure_sandboxes(args) -> Settings:
    """The env worker's settings, its `--sandbox*` flags over the environment's; the sandbox
    backend configured from them (specs that name no backend get it)."""
    from env_workers.sandbox import backends

    s = Settings.from_env(sandbox_backend=args.sandbox, sandbox_image=args.sandbox_image,
                          sandbox_docker_url=args.sandbox_docker_url)
    backends.configure(s.sandbox_backend, docker_url=s.sandbox_docker_url, image=s.sandbox_image)
    return s


def cmd_env_worker(args) -> None:
    from env_workers.envs import judge
    from env_workers.resources import PoolSize
    from env_workers.server import serve

    s = configure_sandboxes(args)
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
    from rollout_service.local import vllm_local

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
