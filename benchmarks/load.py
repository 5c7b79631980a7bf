"""Load on loopback: many batches, many concurrent SSE readers and pollers, no errors.

With `--in-flight N`: N trajectories in flight at once over several worker processes on one
Redis, the API's latency under that load, CPU and Redis memory per trajectory, and the
queue-overhead ratio at the instant engine, in one table (`benchmarks/in_flight.py` says how).

Starts `rollout up` (simulated engine at zero modelled time, external Redis), submits
`--batches` x `--per-batch` trajectories at once, opens one event stream per batch and
`--pollers` clients hammering the status endpoint, and reports trajectories/s, API latency
(p50/p99 of the status calls), errors, and the peak memory of the service's processes.

    python benchmarks/load.py --batches 50 --per-batch 100 --pollers 20
    python benchmarks/load.py --in-flight 100000 --worker-procs 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

import psutil

from trainer_client import AsyncRolloutClient

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
from _up import start_up  # noqa: E402
from benchmarks import in_flight, queue_overhead  # noqa: E402
from benchmarks.redis_private import PrivateRedis  # noqa: E402


async def run(a, url: str, up_pid: int) -> dict:
    errors: list[str] = []
    latencies: list[float] = []
    peak_rss = 0
    done = asyncio.Event()

    async def sample_memory() -> None:
        nonlocal peak_rss
        while not done.is_set():
            procs = [psutil.Process(up_pid), *psutil.Process(up_pid).children(recursive=True)]
            peak_rss = max(peak_rss, sum(p.memory_info().rss for p in procs if p.is_running()))
            await asyncio.sleep(0.2)

    async with AsyncRolloutClient(url, timeout=60) as c:
        t0 = time.perf_counter()
        batches = await asyncio.gather(*(c.submit([{"seed": b * a.per_batch + i} for i in range(a.per_batch)],
                                                  env="math") for b in range(a.batches)))
        mem = asyncio.create_task(sample_memory())

        async def read_events(bid: str) -> int:
            n = 0
            try:
                async for _ in c.events(bid):
                    n += 1
            except Exception as e:  # counted, not raised: the figure is how many
                errors.append(f"events {bid}: {e!r}")
            return n

        async def poll() -> None:
            while not done.is_set():
                bid = batches[len(latencies) % len(batches)].id
                t = time.perf_counter()
                try:
                    await c.status(bid)
                    latencies.append(time.perf_counter() - t)
                except Exception as e:
                    errors.append(f"status: {e!r}")
                await asyncio.sleep(0.01)

        pollers = [asyncio.create_task(poll()) for _ in range(a.pollers)]
        counts = await asyncio.gather(*(read_events(b.id) for b in batches))
        elapsed = time.perf_counter() - t0
        done.set()
        await asyncio.gather(*pollers, mem)
        statuses = await asyncio.gather(*(c.status(b.id) for b in batches))
    total = a.batches * a.per_batch
    latencies.sort()
    return {
        "trajectories": total, "batches": a.batches, "sse_readers": a.batches, "pollers": a.pollers,
        "workers": a.workers, "elapsed_s": elapsed, "trajectories_per_s": total / elapsed,
        "events_received": sum(counts), "completed": sum(s.done for s in statuses),
        "api_p50_ms": statistics.median(latencies) * 1000 if latencies else None,
        "api_p99_ms": latencies[int(len(latencies) * 0.99)] * 1000 if latencies else None,
        "api_calls": len(latencies), "errors": len(errors), "error_samples": errors[:5],
        "peak_rss_mb": peak_rss / 2**20,
    }


def scale(a) -> dict:
    """The in-flight run, then the queue-overhead ratio, on one private Redis."""
    with PrivateRedis() as redis_url:
        res = in_flight.in_flight(a, redis_url)
        in_flight.report(res)
        d, s = asyncio.run(queue_overhead.measure(a.overhead_n, 32, redis_url, 3))
    res["queue_overhead_ratio"] = d / s
    print(f"queue overhead, service/direct at the instant engine ({a.overhead_n} trajectories, median of 3): "
          f"{res['queue_overhead_ratio']:.2f}")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=50)
    ap.add_argument("--per-batch", type=int, default=100)
    ap.add_argument("--pollers", type=int, default=None, help="status pollers (default 20; --in-flight: 10)")
    ap.add_argument("--workers", type=int, default=2, help="rollout worker processes")
    ap.add_argument("--redis-url", default=os.environ.get("ROLLOUT_REDIS_URL", "redis://127.0.0.1:6379/0"))
    ap.add_argument("--out", default=None, help="JSON out (default benchmarks/results/load.json, "
                    "or in_flight.json with --in-flight)")
    ap.add_argument("--in-flight", type=int, default=0, help="run the scale benchmark with this many trajectories")
    ap.add_argument("--worker-procs", type=int, default=4, help="--in-flight: rollout worker processes")
    ap.add_argument("--turn-s", type=float, default=40.0, help="--in-flight: mean seconds a turn takes")
    ap.add_argument("--poll-every-s", type=float, default=0.1, help="--in-flight: each poller's pause between calls")
    ap.add_argument("--worker-nice", type=int, default=0, help="--in-flight: niceness of the worker processes")
    ap.add_argument("--overhead-n", type=int, default=2000, help="--in-flight: trajectories of the queue-overhead run")
    ap.add_argument("--as-worker", action="store_true", help=argparse.SUPPRESS)  # a worker process of --in-flight
    ap.add_argument("--concurrency", type=int, default=32, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.as_worker:
        asyncio.run(in_flight.run_worker(a.concurrency, a.turn_s, a.seed))
        return
    if a.in_flight:
        a.pollers = 10 if a.pollers is None else a.pollers
        res = scale(a)
        out = Path(a.out or "benchmarks/results/in_flight.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=2))
        return
    a.pollers = 20 if a.pollers is None else a.pollers
    proc, url = start_up(a.redis_url, "--engine", "sim", "--sim-time-scale", "0", "--workers", str(a.workers))
    try:
        res = asyncio.run(run(a, url, proc.pid))
    finally:
        proc.terminate()
        proc.wait(30)
    print(f"trajectories: {res['trajectories']} in {res['batches']} batches, {res['sse_readers']} SSE readers, "
          f"{res['pollers']} pollers")
    print(f"trajectories/s: {res['trajectories_per_s']:.0f}")
    print(f"events received: {res['events_received']} of {res['trajectories']}")
    print(f"completed: {res['completed']} of {res['trajectories']}")
    print(f"status API latency p50: {res['api_p50_ms']:.1f} ms")
    print(f"status API latency p99: {res['api_p99_ms']:.1f} ms")
    print(f"errors: {res['errors']}")
    print(f"peak RSS of the service (all processes): {res['peak_rss_mb']:.0f} MiB")
    out = Path(a.out or "benchmarks/results/load.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
