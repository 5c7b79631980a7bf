"""Submit → first claim on an idle cluster: workers blocked on the queue vs polling with back-off.

Side by side in one process against one Redis, each on its own key prefix:
(a) `--workers` real `rollout_service.worker.Worker`s, idle, blocked on the queue's wake list;
(b) the same number of pollers that do what the worker did before the wake list: claim, and
    while the queue is empty sleep 0.05 s doubling to 0.5 s.
Each round waits a seeded idle gap (the cluster sits idle, as between a trainer's steps), then
submits one batch; the first claim's time is the earliest `started_at` among its trajectories
(stamped by the claiming worker just before its claim reaches Redis). Rounds alternate between
(a) and (b) so machine load hits both alike. Prints p50 / p90 for both and their ratio, and
writes JSON.

    python benchmarks/claim_latency.py --rounds 40 --workers 4

Non-goals: throughput under load (benchmarks/queue_overhead.py, benchmarks/load.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import time
import uuid
from pathlib import Path

import redis.asyncio as aioredis

from env_workers.client import LocalEnvs
from rollout_service.engines.fleet import Fleet
from rollout_service.engines.sim import SimEngine
from rollout_service.worker import Worker
from scheduler.keys import Keys
from scheduler.queue import Queue
from scheduler.store import Store
from wire import RolloutRequest

BATCH = RolloutRequest(tasks=[{"seed": i} for i in range(4)], env="math", group_size=2)


async def poller(q: Queue, stop: asyncio.Event) -> None:
    """The claim loop as it was: poll, backing off while idle (0.05 s doubling, at most 0.5 s)."""
    idle = 0.05
    while not stop.is_set():
        c = await q.claim("poller")
        if c is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), idle)
            idle = min(idle * 2, 0.5)
            continue
        idle = 0.05
        await q.complete(c, _done(c.trajectory_id))


def _done(tid: str):
    from scheduler.keys import batch_of
    from wire import Trajectory, TrajectoryState
    return Trajectory(id=tid, batch_id=batch_of(tid), group_index=0, sample_index=0, env="math", task={},
                      state=TrajectoryState.completed, reward=0.0)


async def first_claim_s(r: aioredis.Redis, keys: Keys, q: Queue, store: Store) -> float:
    t0 = time.time()
    b = await q.enqueue(BATCH)
    tids = [f"{b.id}-{g}-{s}" for g in range(len(BATCH.tasks)) for s in range(BATCH.group_size)]
    while True:  # done when the batch is: then every started_at is in
        st = await store.batch_status(b.id)
        if st.finished_at is not None:
            break
        await asyncio.sleep(0.05)
    started = [float(v) for v in await asyncio.gather(*(r.hget(keys.traj(t), "started_at") for t in tids)) if v]
    return min(started) - t0


async def side(kind: str, n_workers: int, redis_url: str) -> tuple:
    """One side's Redis client, prefix, queue, store, worker tasks and stop event."""
    r = aioredis.from_url(redis_url)
    keys = Keys(f"bench:claim:{uuid.uuid4().hex[:8]}:")
    q, store, stop = Queue(r, keys), Store(r, keys), asyncio.Event()
    if kind == "blocking":
        tasks = [asyncio.create_task(Worker(q, store, Fleet({"sim": (SimEngine("sim"), "byte")}), LocalEnvs(),
                                            concurrency=8).run(stop)) for _ in range(n_workers)]
    else:
        tasks = [asyncio.create_task(poller(q, stop)) for _ in range(n_workers)]
    return r, keys, q, store, tasks, stop


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=40, help="batches submitted to each side")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--idle", type=float, nargs=2, default=(0.5, 2.0), help="idle gap before a submit, min max (s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--redis-url", default=os.environ.get("ROLLOUT_REDIS_URL", "redis://127.0.0.1:6379/0"))
    ap.add_argument("--out", default="benchmarks/results/claim_latency.json")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    sides = {k: await side(k, a.workers, a.redis_url) for k in ("blocking", "polling")}
    got: dict[str, list[float]] = {k: [] for k in sides}
    await asyncio.sleep(1.0)  # every worker reaches its idle wait
    for _ in range(a.rounds):
        for kind, (r, keys, q, store, _, _) in sides.items():
            await asyncio.sleep(rng.uniform(*a.idle))
            got[kind].append(await first_claim_s(r, keys, q, store))
    res: dict = {"rounds": a.rounds, "workers": a.workers, "idle_gap_s": list(a.idle), "seed": a.seed}
    for kind, xs in got.items():
        qs = statistics.quantiles(xs, n=10)
        res[kind] = {"p50_ms": statistics.median(xs) * 1e3, "p90_ms": qs[8] * 1e3, "samples_ms": [x * 1e3 for x in xs]}
        print(f"{kind:8s} submit->first claim p50: {res[kind]['p50_ms']:.2f} ms  p90: {res[kind]['p90_ms']:.2f} ms")
    res["polling_over_blocking_p50"] = res["polling"]["p50_ms"] / res["blocking"]["p50_ms"]
    print(f"ratio polling/blocking p50: {res['polling_over_blocking_p50']:.1f}x")
    for r, keys, _, _, tasks, stop in sides.values():
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        async for k in r.scan_iter(match=f"{keys.prefix}*", count=1000):
            await r.delete(k)
        await r.aclose()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
