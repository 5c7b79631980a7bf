"""Chaos soak: `rollout up` on its defaults, continuous batches, `kill -9` every few seconds.

`rollout up --engine sim --workers 2` runs with everything else as a user gets it (the
embedded Redis with its append-only file, a 30 s lease, 3 attempts). A trainer thread keeps
a few `calc` batches open through the SDK while a seeded schedule `kill -9`s a random
component every 2-6 s (gateway, either rollout worker, the env worker, Redis, the engine),
and sometimes two at once. Afterwards it waits for every batch, then checks what a trainer
would: no trajectory lost, none reported twice, how many finished without failure, how long
a fresh batch takes, and that `/metrics` counts every restart.

    python benchmarks/chaos.py --minutes 5 --seed 1          # prints one line per figure, writes JSON

The test suite runs a two-minute version (`tests/e2e/test_chaos.py`) through `soak()`.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import psutil

from trainer_client import RolloutClient
from trainer_client._errors import RolloutError

COMPONENTS = ("gateway", "worker", "env-worker", "redis", "engine")
TASKS_PER_BATCH, GROUP = 8, 4


def _is(component: str, cmd: str) -> bool:
    if component == "redis":
        return "redis-server" in cmd
    if "rollout_service.cli" not in cmd:
        return False
    word = {"gateway": " gateway", "worker": " worker ", "env-worker": " env-worker", "engine": " sim-engine"}
    return word[component] in cmd + " "


def processes(up_pid: int, component: str) -> list[psutil.Process]:
    """The live processes of one component under `rollout up` (several for `worker`)."""
    out = []
    for p in psutil.Process(up_pid).children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and _is(component, " ".join(p.cmdline())):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@dataclass
class Report:
    seconds: float = 0.0
    kills: dict[str, int] = field(default_factory=dict)  # component -> kill -9s that hit a live process
    batches: int = 0
    trajectories: int = 0
    lost: int = 0  # submitted but never reached a terminal state
    duplicated: int = 0  # reported finished more than once, or one idempotency key -> two batches
    completed: int = 0
    truncated: int = 0
    failed: dict[str, int] = field(default_factory=dict)  # failure kind -> n
    restarted_trajectories: int = 0
    settle_s: float = 0.0  # from the last kill to every batch done
    fresh_batch_s: float = 0.0  # a new 32-trajectory batch afterwards, submit to done
    metrics_restarts: dict[str, int] = field(default_factory=dict)  # rollout_component_restarts_total
    metrics_trajectory_restarts: int = 0

    @property
    def ok_share(self) -> float:
        """Trajectories that ended without a failure (completed, or truncated by max_turns)."""
        return (self.completed + self.truncated) / self.trajectories if self.trajectories else 0.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(workdir: Path, workers: int) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUT_")}  # the defaults, embedded Redis
    env["ROLLOUT_CACHE_DIR"] = str(workdir / "cache")
    proc = subprocess.Popen([sys.executable, "-m", "rollout_service.cli", "up", "--engine", "sim", "--port", str(port),
                             "--workers", str(workers)], env=env, stdout=open(workdir / "up.log", "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"rollout up exited: {(workdir / 'up.log').read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/v1/workers", timeout=1).json():
                return proc, url
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.2)
    stop(proc)
    raise RuntimeError("rollout up did not become ready")


def stop(proc: subprocess.Popen) -> None:
    children = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    for p in psutil.wait_procs(children, timeout=15)[1]:
        p.kill()


class Trainer(threading.Thread):
    """Keeps `max_open` batches in flight until told to stop; every submit carries its own
    idempotency key and is retried until acknowledged, however long the gateway is away."""

    def __init__(self, url: str, max_open: int = 3):
        super().__init__(daemon=True)
        self.url, self.max_open = url, max_open
        self.ids: dict[str, set[str]] = {}  # idempotency key -> batch ids the gateway answered
        self.done: set[str] = set()
        self.halt = threading.Event()
        self.errors = 0

    def run(self) -> None:
        n = 0
        with RolloutClient(self.url, timeout=10, retries=12) as c:
            while not self.halt.is_set():
                open_ = [b for ids in self.ids.values() for b in ids if b not in self.done]
                try:
                    for b in open_:
                        if c.status(b).finished_at is not None:
                            self.done.add(b)
                    if len(open_) - len([b for b in open_ if b in self.done]) < self.max_open:
                        key = f"chaos-{n}"
                        tasks = [{"seed": n * TASKS_PER_BATCH + i} for i in range(TASKS_PER_BATCH)]
                        got = c.submit(tasks, env="calc", group_size=GROUP, max_turns=4, idempotency_key=key,
                                       sampling={"temperature": 1.0, "max_tokens": 64})
                        self.ids.setdefault(key, set()).add(got.id)
                        n += 1
                except RolloutError:
                    self.errors += 1  # gateway or Redis away past the client's retries: the same key next round
                    continue
                self.halt.wait(0.3)


def soak(minutes: float, seed: int, workdir: Path, workers: int = 2, every_s: tuple[float, float] = (2.0, 6.0),
         two_at_once: float = 0.2, say=print) -> Report:
    rng = random.Random(seed)
    rep = Report(kills={c: 0 for c in COMPONENTS})
    proc, url = start(workdir, workers)
    try:
        trainer = Trainer(url)
        trainer.start()
        t0 = time.monotonic()
        order: list[str] = []
        while time.monotonic() - t0 < minutes * 60:
            time.sleep(rng.uniform(*every_s))
            if not order:  # every component in each round, in a seeded order
                order = rng.sample(COMPONENTS, len(COMPONENTS))
            victims = [order.pop()]
            if order and rng.random() < two_at_once:
                victims.append(order.pop())
            for v in victims:
                live = processes(proc.pid, v)
                if live:
                    target = rng.choice(live)
                    with_pid = target.pid
                    try:
                        target.send_signal(signal.SIGKILL)
                        rep.kills[v] += 1
                        say(f"  t={time.monotonic() - t0:5.1f}s  kill -9 {v} (pid {with_pid})")
                    except psutil.NoSuchProcess:
                        pass
        last_kill = time.monotonic()
        trainer.halt.set()
        trainer.join(120)
        rep.seconds = round(time.monotonic() - t0, 1)
        _settle(url, trainer, rep, deadline_s=600)
        rep.settle_s = round(time.monotonic() - last_kill, 1)
        _verify(url, trainer, rep)
        t = time.monotonic()
        with RolloutClient(url, timeout=10) as c:
            fresh = c.submit([{"seed": 10**6 + i} for i in range(TASKS_PER_BATCH)], env="calc", group_size=GROUP,
                             max_turns=4, sampling={"temperature": 1.0, "max_tokens": 64})
            c.wait(fresh.id, poll_s=0.1, timeout=300)
        rep.fresh_batch_s = round(time.monotonic() - t, 2)
        time.sleep(2.5)  # one supervisor bookkeeping tick after the last restart
        _metrics(url, rep)
    finally:
        stop(proc)
    return rep


def _settle(url: str, trainer: Trainer, rep: Report, deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    with RolloutClient(url, timeout=10, retries=12) as c:
        for ids in trainer.ids.values():
            for b in ids:
                while c.status(b).finished_at is None:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"batch {b} not done {deadline_s}s after the soak")
                    time.sleep(0.2)


def _verify(url: str, trainer: Trainer, rep: Report) -> None:
    failures: collections.Counter[str] = collections.Counter()
    with RolloutClient(url, timeout=30, retries=12) as c:
        for ids in trainer.ids.values():
            rep.duplicated += len(ids) - 1  # one key, two batches: a submit was not idempotent
            for b in ids:
                st = c.status(b)
                rep.batches += 1
                rep.trajectories += st.num_trajectories
                seen = collections.Counter(ev.trajectory_id for ev in c.events(b))
                rep.duplicated += sum(n - 1 for n in seen.values())
                trajs = {t.id: t for t in c.trajectories(b)}
                terminal = {i for i, t in trajs.items() if t.state.terminal}
                rep.lost += st.num_trajectories - len(terminal & set(seen))
                for t in trajs.values():
                    rep.restarted_trajectories += t.restarts > 0
                    if t.state.value == "completed":
                        rep.completed += 1
                    elif t.state.value == "truncated":
                        rep.truncated += 1
                    elif t.failure is not None:
                        failures[t.failure.kind.value] += 1
    rep.failed = dict(failures)


def _metrics(url: str, rep: Report) -> None:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    for comp, n in re.findall(r'^rollout_component_restarts_total\{component="([^"]+)"\} ([0-9.e+]+)$', text, re.M):
        rep.metrics_restarts[comp] = int(float(n))
    m = re.search(r"^rollout_trajectory_restarts_total ([0-9.e+]+)$", text, re.M)
    rep.metrics_trajectory_restarts = int(float(m.group(1))) if m else 0


def restarts_by_kind(rep: Report) -> dict[str, int]:
    """`/metrics` restart counts summed per component kind (worker-0 + worker-1 -> worker)."""
    out: dict[str, int] = collections.Counter()
    for comp, n in rep.metrics_restarts.items():
        kind = next((k for k in ("env-worker", "worker", "gateway", "redis", "engine") if comp.startswith(k)), comp)
        out[kind] += n
    return dict(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/chaos.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        rep = soak(args.minutes, args.seed, Path(tmp), args.workers)
    print(f"soak_s                   {rep.seconds}")
    print(f"kills                    {sum(rep.kills.values())}  {rep.kills}")
    print(f"batches                  {rep.batches}")
    print(f"trajectories             {rep.trajectories}")
    print(f"lost                     {rep.lost}")
    print(f"duplicated               {rep.duplicated}")
    print(f"finished_ok_share        {rep.ok_share:.4f}  (completed {rep.completed}, truncated {rep.truncated}, "
          f"failed {rep.failed})")
    print(f"restarted_trajectories   {rep.restarted_trajectories}  (/metrics: {rep.metrics_trajectory_restarts})")
    print(f"settle_s                 {rep.settle_s}")
    print(f"fresh_batch_s            {rep.fresh_batch_s}")
    print(f"metrics_restarts         {restarts_by_kind(rep)}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**asdict(rep), "ok_share": rep.ok_share, "seed": args.seed,
                               "load": os.getloadavg()}, indent=2))


if __name__ == "__main__":
    main()
