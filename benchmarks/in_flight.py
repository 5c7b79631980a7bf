"""Many trajectories in flight at once on one Redis: what the data plane costs at cluster scale.

`python benchmarks/load.py --in-flight N` runs this. It starts a private Redis, one gateway
process and `--worker-procs` rollout worker processes (the real `Worker`, each with
N / procs slots), submits N trajectories (`calc` episodes, GRPO groups of 8, batches of
10,000), and watches until every one has finished. Each worker's engine is the simulated one
answering every turn after `--turn-s` x U(0.5, 1.5) seconds, standing in for a busy GPU
cluster's turn (queueing, prefill, a few hundred decode steps), so work stays in flight. The
engine and the environments run inside the worker processes: what is measured is the
service (gateway, queue, leases, worker), not an engine's HTTP server.

Meanwhile `--pollers` clients call the status API (`GET /v1/batches/{id}`) and the trajectory
API (`GET /v1/trajectories/{id}`, a trajectory picked at random, running or not) in turn,
one call every `--poll-every-s` each. Reported: the most in flight at once and how long at least
95% of N were; API latency p50/p99 while at least 90% of N were in flight (and over the whole
run); CPU seconds per trajectory of the gateway, the workers and Redis; Redis memory per
trajectory in flight at the peak.

    python benchmarks/load.py --in-flight 100000 --worker-procs 4          # ~4 min, ~4 GB
    python benchmarks/load.py --in-flight 2000 --worker-procs 2 --turn-s 4  # a short look
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import redis.asyncio as aioredis

from benchmarks.redis_private import free_port
from benchmarks.sim.fidelity import pct
from rollout_service.engines.base import GenerateResult
from rollout_service.engines.sim import SimEngine
from trainer_client import AsyncRolloutClient

BATCH = 10_000  # the gateway's default most trajectories a request
GROUP = 8


class LatencyEngine(SimEngine):
    """Answers each turn after `turn_s` x U(0.5, 1.5) seconds: `calc: 1 + 1` until the last of
    `turns` turns, then `answer: 2` (so the `calc` env makes every episode `turns` turns long).
    The reply is fixed, not the toy policy's: reading the whole prompt each turn would make the
    simulated engine, not the service, the largest CPU cost in the worker processes."""

    def __init__(self, turn_s: float, seed: int, turns: int = 3):
        super().__init__("sim-0", seed=seed)
        self.turn_s, self.turns, self._jitter = turn_s, turns, random.Random(seed)
        self._replies = [[*self.tok.encode(text), self.tok.eos_id] for text in ("calc: 1 + 1", "answer: 2")]

    async def generate(self, req):
        await asyncio.sleep(self.turn_s * self._jitter.uniform(0.5, 1.5))
        last = int(req.request_id.rsplit("-", 1)[1]) + 1 >= self.turns  # the rollout's ids end in the turn's index
        ids = self._replies[last][: req.sampling.max_tokens]
        return GenerateResult(ids, [-0.5] * len(ids), "stop", self.policy_version, self.id)


async def run_worker(concurrency: int, turn_s: float, seed: int) -> None:
    """One rollout worker process, as `rollout worker` runs it, with the latency engine in it."""
    from env_workers.client import LocalEnvs
    from rollout_service.config import Settings
    from rollout_service.engines.fleet import Fleet
    from rollout_service.runtime import tune_gc
    from rollout_service.worker import Worker
    from scheduler.connection import connect
    from scheduler.keys import Keys
    from scheduler.queue import Queue
    from scheduler.store import Store

    from rollout_service import logs

    logs.configure("worker", logging.WARNING)  # restarts, reaps and lost leases: the run counts them
    s = Settings.from_env()
    r, keys = connect(s.redis_url), Keys(s.key_prefix)
    worker = Worker(Queue(r, keys, s.lease_s, s.max_attempts, s.max_restarts), Store(r, keys),
                    Fleet({"sim-0": (LatencyEngine(turn_s, seed), "byte")}), LocalEnvs(), concurrency=concurrency)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    tune_gc()
    await worker.run(stop)


def _cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


async def _redis_cpu_s(r: aioredis.Redis) -> float:
    info = await r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def drive(a, url: str, redis_url: str, prefix: str, pids: dict[str, list[int]]) -> dict:
    r = aioredis.from_url(redis_url)
    leases = f"{prefix}leases"
    n = a.in_flight
    samples: list[tuple[float, int, int]] = []  # (t, in flight, Redis used_memory)
    calls: list[tuple[str, float, int]] = []  # (kind, seconds, in flight when it was sent)
    errors: list[str] = []
    state = {"in_flight": 0, "done": False}
    base_mem = int((await r.info("memory"))["used_memory"])
    cpu0 = {k: [_cpu_s(p) for p in v] for k, v in pids.items()}
    redis_cpu0 = await _redis_cpu_s(r)
    async with AsyncRolloutClient(url, timeout=120) as c:
        t0 = time.perf_counter()
        batches = []
        for b in range(math.ceil(n / BATCH)):
            size = min(BATCH, n - b * BATCH)
            batches.append(await c.submit([{"seed": b * BATCH + i} for i in range(size // GROUP)], env="calc",
                                          group_size=GROUP, max_turns=3, sampling={"max_tokens": 16}))
        submitted_s = time.perf_counter() - t0
        print(f"submitted {n} trajectories in {len(batches)} batches in {submitted_s:.1f} s", flush=True)

        async def watch() -> None:
            last = 0.0
            while not state["done"]:
                state["in_flight"] = int(await r.zcard(leases))
                mem = int((await r.info("memory"))["used_memory"])
                samples.append((time.perf_counter() - t0, state["in_flight"], mem))
                if time.perf_counter() - last > 10:
                    last = time.perf_counter()
                    print(f"  t={samples[-1][0]:.0f}s in flight {state['in_flight']}", flush=True)
                await asyncio.sleep(0.5)

        async def poll(i: int) -> None:
            rng = random.Random(i)
            while not state["done"]:
                b = rng.choice(batches)
                for kind in ("status", "trajectory"):
                    at = state["in_flight"]
                    t = time.perf_counter()
                    try:
                        if kind == "status":
                            await c.status(b.id)
                        else:
                            g = rng.randrange(b.num_trajectories // GROUP)
                            await c.trajectory(f"{b.id}-{g}-{rng.randrange(GROUP)}")
                        calls.append((kind, time.perf_counter() - t, at))
                    except Exception as e:  # counted, not raised: the figure is how many
                        errors.append(f"{kind}: {e!r}")
                    await asyncio.sleep(a.poll_every_s)

        watcher = asyncio.create_task(watch())
        pollers = [asyncio.create_task(poll(i)) for i in range(a.pollers)]
        while True:
            statuses = await asyncio.gather(*(c.status(b.id) for b in batches))
            if all(s.finished_at is not None for s in statuses):
                break
            await asyncio.sleep(2.0)
        elapsed = time.perf_counter() - t0
        state["done"] = True
        await asyncio.gather(watcher, *pollers)
    cpu = {k: sum(_cpu_s(p) for p in v) - sum(cpu0[k]) for k, v in pids.items()}
    cpu["redis"] = await _redis_cpu_s(r) - redis_cpu0
    await r.aclose()
    completed = sum(s.done for s in statuses)
    peak = max(samples, key=lambda s: s[1])
    dt = [b[0] - a_[0] for a_, b in zip(samples, samples[1:])]
    held = sum(d for d, s in zip(dt, samples) if s[1] >= 0.95 * n)
    loaded = [x for x in calls if x[2] >= 0.9 * n]
    out = {
        "trajectories": n, "worker_procs": a.worker_procs, "turn_s": a.turn_s, "pollers": a.pollers,
        "elapsed_s": elapsed, "submit_s": submitted_s, "completed": completed,
        "peak_in_flight": peak[1], "seconds_at_95pct_in_flight": held,
        "redis_bytes_per_in_flight_trajectory": (peak[2] - base_mem) / max(peak[1], 1),
        "redis_peak_mb": max(s[2] for s in samples) / 2**20,
        "cpu_ms_per_trajectory": {k: v / max(completed, 1) * 1000 for k, v in cpu.items()},
        "api_calls": len(calls), "api_calls_at_90pct_in_flight": len(loaded), "errors": len(errors),
        "error_samples": errors[:5],
    }
    for kind in ("status", "trajectory"):
        for label, xs in (("loaded", loaded), ("all", calls)):
            lat = [x[1] for x in xs if x[0] == kind]
            out[f"{kind}_p50_ms_{label}"] = pct(lat, 0.5) * 1000 if lat else None
            out[f"{kind}_p99_ms_{label}"] = pct(lat, 0.99) * 1000 if lat else None
    return out


def in_flight(a, redis_url: str) -> dict:
    """Start the gateway and the workers against `redis_url`, drive them, stop them."""
    prefix = "bench:inflight:"
    env = {**os.environ, "ROLLOUT_REDIS_URL": redis_url, "ROLLOUT_KEY_PREFIX": prefix,
           "ROLLOUT_MAX_OPEN_PER_TENANT": str(2 * a.in_flight)}
    port = free_port()
    gateway = subprocess.Popen([sys.executable, "-m", "rollout_service.cli", "gateway", "--port", str(port)],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    per = math.ceil(a.in_flight / a.worker_procs)
    log_dir = Path(tempfile.mkdtemp(prefix="in_flight-"))
    logs = [open(log_dir / f"worker-{i}.log", "wb") for i in range(a.worker_procs)]
    workers = [subprocess.Popen([sys.executable, str(Path(__file__).parent / "load.py"), "--as-worker",
                                 "--concurrency", str(per), "--turn-s", str(a.turn_s), "--seed", str(i)],
                                env=env, stdout=f, stderr=subprocess.STDOUT,
                                preexec_fn=(lambda: os.nice(a.worker_nice)) if a.worker_nice else None)
               for i, f in enumerate(logs)]
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            raise SystemExit("the gateway did not start")
        res = asyncio.run(drive(a, url, redis_url, prefix, {"gateway": [gateway.pid],
                                                            "workers": [w.pid for w in workers]}))
    finally:
        for p in (gateway, *workers):
            p.terminate()
        for p in (gateway, *workers):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        for f in logs:
            f.close()
    res["worker_warnings"] = warnings(log_dir)
    res["worker_logs"] = str(log_dir)
    return res


def warnings(log_dir: Path) -> dict[str, int]:
    """How often each warning the workers logged came up (restarts, reaps, lost leases)."""
    seen: collections.Counter[str] = collections.Counter()
    for path in log_dir.glob("worker-*.log"):
        for line in path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
                seen[f"{rec.get('level', '?')}: {rec.get('msg', line)[:80]} {str(rec.get('reason', ''))[:60]}".strip()] += 1
            except ValueError:
                seen[line[:80]] += 1
    return dict(seen.most_common(10))


def report(res: dict) -> None:
    print(f"trajectories: {res['trajectories']} over {res['worker_procs']} worker processes, "
          f"turns of {res['turn_s']} s x U(0.5, 1.5), {res['pollers']} API pollers")
    print(f"completed: {res['completed']} of {res['trajectories']} in {res['elapsed_s']:.0f} s "
          f"(submitted in {res['submit_s']:.1f} s), errors: {res['errors']}")
    print(f"peak in flight: {res['peak_in_flight']}")
    print(f"seconds with >= 95% in flight: {res['seconds_at_95pct_in_flight']:.0f}")
    for kind in ("status", "trajectory"):
        print(f"{kind} API p50 / p99 at >= 90% in flight: {res[f'{kind}_p50_ms_loaded'] or float('nan'):.1f} / "
              f"{res[f'{kind}_p99_ms_loaded'] or float('nan'):.1f} ms "
              f"(whole run: {res[f'{kind}_p50_ms_all'] or float('nan'):.1f} / "
              f"{res[f'{kind}_p99_ms_all'] or float('nan'):.1f} ms)")
    for k, v in res["cpu_ms_per_trajectory"].items():
        print(f"{k} CPU per trajectory: {v:.2f} ms")
    for msg, n in res["worker_warnings"].items():
        print(f"worker log: {n} x {msg}")
    print(f"Redis memory per trajectory in flight: {res['redis_bytes_per_in_flight_trajectory']:.0f} bytes "
          f"(peak {res['redis_peak_mb']:.0f} MiB)")
