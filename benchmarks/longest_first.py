"""A sync step's makespan with the queue in FIFO order vs longest-expected first, in the simulator.

A trainer's step submits one batch per environment (`--envs`, in that order: cheap ones first,
as a list sorted by name or by cost might) and waits for all of them. `benchmarks/sim/claims.py`
runs it on `--slots` rollout slots in simulated time, claiming from the real queue on a real
Redis. Per seed: a warm-up step (another draw, not timed) teaches the real forecaster each
environment's episode duration, which is published as a live worker does (it keeps learning
from the FIFO run too, as a live one would between steps); then the same
episodes run twice, once with a FIFO queue and once with `longest_first`. Prints each seed's
makespans and their ratio (with a lower bound no order can beat: the longest episode, or all
the work spread evenly over the slots), the median ratio, and writes JSON.

    python benchmarks/longest_first.py --seeds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import uuid
from pathlib import Path

import redis.asyncio as aioredis

from benchmarks.sim.claims import draw_step, episode_s, run_step
from scheduler.forecast import Forecaster
from scheduler.keys import Keys
from scheduler.queue import Queue


async def one_seed(r: aioredis.Redis, seed: int, a) -> dict:
    fc = Forecaster()
    out: dict = {"seed": seed}
    for name, longest in (("warmup", False), ("fifo", False), ("longest_first", True)):
        keys = Keys(f"bench:lf:{uuid.uuid4().hex[:8]}:")
        q = Queue(r, keys, lease_s=3600, longest_first=longest)  # simulated time: no lease lapses
        await q.report_expected(fc.expected_s())
        step = draw_step(a.envs, a.tasks, a.group, seed * 1000 + (0 if name == "warmup" else 1))
        got = await run_step(q, step, a.group, a.slots, fc, a.decode_tok_s)
        out[name] = {"makespan_s": got.makespan_s, "env_finished_s": got.finished_s}
        durations = [episode_s(ep, a.decode_tok_s) for eps in step.values() for ep in eps]
        out["lower_bound_s"] = max(max(durations), sum(durations) / a.slots)  # no order can beat it
        async for k in r.scan_iter(match=f"{keys.prefix}*", count=1000):
            await r.delete(k)
    out["expected_s"] = fc.expected_s()
    out["ratio_fifo_over_longest_first"] = out["fifo"]["makespan_s"] / out["longest_first"]["makespan_s"]
    return out


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", nargs="+", default=["math", "reason", "coding", "web", "swe"])
    ap.add_argument("--tasks", type=int, default=16, help="tasks per env batch")
    ap.add_argument("--group", type=int, default=8, help="GRPO group size")
    ap.add_argument("--slots", type=int, default=256, help="trajectories the cluster runs at once")
    ap.add_argument("--decode-tok-s", type=float, default=50.0, help="one sequence's decode speed")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--redis-url", default=os.environ.get("ROLLOUT_REDIS_URL", "redis://127.0.0.1:6379/0"))
    ap.add_argument("--out", default="benchmarks/results/longest_first.json")
    a = ap.parse_args()
    r = aioredis.from_url(a.redis_url)
    runs = [await one_seed(r, s, a) for s in range(a.seeds)]
    await r.aclose()
    for x in runs:
        print(f"seed {x['seed']}: makespan FIFO {x['fifo']['makespan_s']:.0f} s, longest-first "
              f"{x['longest_first']['makespan_s']:.0f} s, ratio {x['ratio_fifo_over_longest_first']:.2f}x "
              f"(lower bound for any order {x['lower_bound_s']:.0f} s)")
    learned = ", ".join(f"{e} {s:.0f} s" for e, s in sorted(runs[-1]["expected_s"].items(), key=lambda kv: -kv[1]))
    print(f"expected episode time learned (last seed): {learned}")
    med = statistics.median(x["ratio_fifo_over_longest_first"] for x in runs)
    print(f"makespan ratio FIFO/longest-first (median of {a.seeds} seeds): {med:.2f}x")
    res = {"config": {k: v for k, v in vars(a).items() if k != "redis_url"}, "runs": runs,
           "median_ratio_fifo_over_longest_first": med}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
