"""What the service costs on top of running episodes directly.

Runs the same N single-turn `math` episodes against an instant simulated engine twice,
side by side in one process: (a) `run_episode` called directly, (b) through the service
path (Redis queue, lease, worker, result write, event). Prints trajectories/s for both
(medians), their ratio and the added time per trajectory, and writes JSON. The process's
garbage collector is set up as `rollout worker` sets up its own (`rollout_service.runtime`),
for both paths alike.

    python benchmarks/queue_overhead.py --n 2000 --concurrency 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
import uuid
from pathlib import Path

import redis.asyncio as aioredis

from env_workers.client import LocalEnvs
from rollout_service.engines.fleet import Fleet
from rollout_service.engines.sim import SimEngine
from rollout_service.rollout import run_episode
from rollout_service.runtime import tune_gc
from rollout_service.worker import Worker
from scheduler.keys import Keys
from scheduler.queue import Queue
from scheduler.store import Store, Work
from wire import RolloutRequest


async def direct(n: int, concurrency: int) -> float:
    fleet = Fleet({"sim": (SimEngine("sim"), "byte")})
    params = RolloutRequest(tasks=[{}], env="math")
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with sem:
            await run_episode(Work(f"d-{i}", "d", i, 0, {"seed": i}, params), fleet, LocalEnvs())

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return time.perf_counter() - t0


async def service(n: int, concurrency: int, redis_url: str, keep_prefix: str | None = None) -> float:
    """`keep_prefix`: the keys' prefix, and leave them (`queue_instructions.py` deletes them uncounted)."""
    # (no read timeout: under valgrind, as queue_instructions.py runs it, a busy loop reads replies late)
    r = aioredis.from_url(redis_url, socket_timeout=None)
    keys = Keys(keep_prefix or f"bench:{uuid.uuid4().hex[:8]}:")
    q, store = Queue(r, keys), Store(r, keys)
    worker = Worker(q, store, Fleet({"sim": (SimEngine("sim"), "byte")}), LocalEnvs(), concurrency=concurrency)
    stop = asyncio.Event()
    t0 = time.perf_counter()
    b = await q.enqueue(RolloutRequest(tasks=[{"seed": i} for i in range(n)], env="math"))
    run = asyncio.create_task(worker.run(stop))
    after = "0"
    while True:  # done when the batch's end event arrives, as a trainer would see it
        got = await store.events(b.id, after, block_ms=1000, count=1000)
        if got:
            after = got[-1][0]
            if got[-1][1] is None:
                break
    elapsed = time.perf_counter() - t0
    stop.set()
    await run
    if keep_prefix is None:
        async for k in r.scan_iter(match=f"{keys.prefix}*", count=1000):
            await r.delete(k)
    await r.aclose()
    return elapsed


async def measure(n: int, concurrency: int, redis_url: str, repeats: int) -> tuple[float, float]:
    """Median seconds of `repeats` direct and service runs, interleaved so drift hits both alike."""
    tune_gc()
    d_runs, s_runs = [], []
    for _ in range(repeats):
        d_runs.append(await direct(n, concurrency))
        s_runs.append(await service(n, concurrency, redis_url))
    return statistics.median(d_runs), statistics.median(s_runs)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000, help="trajectories per run")
    ap.add_argument("--concurrency", type=int, default=32, help="episodes in flight")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each; medians are reported")
    ap.add_argument("--redis-url", default=os.environ.get("ROLLOUT_REDIS_URL", "redis://127.0.0.1:6379/0"))
    ap.add_argument("--out", default="benchmarks/results/queue_overhead.json")
    a = ap.parse_args()
    d, s = await measure(a.n, a.concurrency, a.redis_url, a.repeats)
    per_traj_ms = (s - d) / a.n * 1000  # amortized: the service's own cost per trajectory
    res = {"n": a.n, "concurrency": a.concurrency, "direct_traj_per_s": a.n / d, "service_traj_per_s": a.n / s,
           "service_over_direct": (a.n / s) / (a.n / d), "added_ms_per_trajectory_amortized": per_traj_ms}
    print(f"direct  trajectories/s (median of {a.repeats}): {res['direct_traj_per_s']:.0f}")
    print(f"service trajectories/s (median of {a.repeats}): {res['service_traj_per_s']:.0f}")
    print(f"ratio service/direct: {res['service_over_direct']:.2f}")
    print(f"added wall time per trajectory (amortized): {per_traj_ms:.2f} ms")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
