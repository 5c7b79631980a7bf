"""Redis memory per trajectory, at each stage of its life, in a private Redis (used_memory deltas).

    queued       the trajectory hash, its queue and batch-list entries (task json included)
    in flight    + its lease, and the live turns the running attempt has recorded so far
                 (packed, as stored now; and as JSON, as stored before the compact form)
    finished     its result (one zstd frame of the packed trajectory; and as JSON, before), or with
                 a file result store, only the reference to it

Turns are synthetic (`benchmarks.payload.synthetic`: Zipf ids over a 151,936-token vocabulary,
float32 logprobs, the transcript); `--turns` of 1,024 tokens each are in flight per trajectory.
Prints one line per figure and writes JSON.

    python benchmarks/redis_memory.py --n 2000 --turns 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

import numpy as np
import redis.asyncio as aioredis

from benchmarks.payload import synthetic
from benchmarks.redis_private import PrivateRedis
from scheduler.keys import Keys
from scheduler.queue import Queue
from scheduler.results import FileResults, ResultStore
from wire import RolloutRequest


async def used(r: aioredis.Redis) -> int:
    return int((await r.info("memory"))["used_memory"])


async def stage(r: aioredis.Redis, keys: Keys, n: int, turns: int, packed: bool, seed: int,
                results: ResultStore | None = None) -> dict[str, float]:
    q = Queue(r, keys, results=results)
    tpl = synthetic(np.random.default_rng(seed), turns * 1024)
    tasks = [{"repo": "org/repo", "issue": i, "prompt": "fix the failing test " * 8} for i in range(n)]
    m0 = await used(r)
    b = await q.enqueue(RolloutRequest(tasks=tasks, env="swe"))
    m1 = await used(r)
    claims = [await q.claim("bench") for _ in range(n)]
    m2 = await used(r)
    for c in claims:
        for t in tpl.turns:
            if packed:
                await q.append_turn(c, t)
            else:  # what the turn script stored before: the Turn's JSON
                await r.rpush(keys.traj_turns(c.trajectory_id), t.model_dump_json())
    m3 = await used(r)
    for c in claims:
        t = tpl.model_copy(update={"id": c.trajectory_id, "batch_id": b.id})
        if packed:
            await q.complete(c, t)
        else:  # before: the result's JSON in the hash, the live turns dropped
            await r.hset(keys.traj(c.trajectory_id), "result", t.model_dump_json())
            await r.delete(keys.traj_turns(c.trajectory_id))
    m4 = await used(r)
    tokens = sum(len(t.prompt_ids) + len(t.output_ids) for t in tpl.turns)
    return {"queued_bytes": (m1 - m0) / n, "claimed_bytes": (m2 - m0) / n, "in_flight_bytes": (m3 - m0) / n,
            "turn_bytes_per_token": (m3 - m2) / n / tokens, "finished_bytes": (m4 - m0) / n,
            "result_bytes_per_token": (m4 - m2) / n / tokens, "tokens_in_flight": tokens}


async def run(n: int, turns: int, seed: int) -> dict[str, dict[str, float]]:
    out = {}
    with PrivateRedis() as url, tempfile.TemporaryDirectory() as blobs:
        r = aioredis.from_url(url)
        for name, packed, results in (("json_before", False, None), ("compact", True, None),
                                      ("compact_file_store", True, FileResults(blobs))):
            out[name] = await stage(r, Keys(f"bench:{name}:"), n, turns, packed, seed, results)
            await r.flushdb()
        await r.aclose()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000, help="trajectories")
    ap.add_argument("--turns", type=int, default=4, help="turns of 1,024 tokens recorded per in-flight trajectory")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/redis_memory.json")
    a = ap.parse_args()
    res = asyncio.run(run(a.n, a.turns, a.seed))
    for name, f in res.items():
        print(f"{name:12s} queued {f['queued_bytes']:8.0f} B/trajectory   claimed {f['claimed_bytes']:8.0f}   "
              f"in flight ({f['tokens_in_flight']} tokens recorded) {f['in_flight_bytes']:9.0f} "
              f"({f['turn_bytes_per_token']:.2f} B/token)   finished {f['finished_bytes']:9.0f} "
              f"({f['result_bytes_per_token']:.2f} B/token)")
    j, c = res["json_before"], res["compact"]
    print(f"finished, result in a file store: {res['compact_file_store']['finished_bytes']:.0f} B of Redis per trajectory")
    res["ratio"] = {"in_flight": j["in_flight_bytes"] / c["in_flight_bytes"],
                    "finished": j["finished_bytes"] / c["finished_bytes"]}
    print(f"in-flight trajectory: {c['in_flight_bytes'] / 1024:.1f} KiB compact vs {j['in_flight_bytes'] / 1024:.1f} "
          f"KiB before ({res['ratio']['in_flight']:.2f}x); finished: {res['ratio']['finished']:.2f}x")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"n": a.n, "turns": a.turns, **res}, indent=2))


if __name__ == "__main__":
    main()
