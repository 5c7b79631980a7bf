"""What the service costs on top of running episodes directly, in CPU instructions.

`queue_overhead.py`'s two paths, each counted by valgrind (callgrind) instead of timed:
instructions are the same from run to run whatever else the machine does, where wall time on a
shared or throttled machine drifts by 25% within minutes. Each path runs in a child process under
valgrind twice, with `--base` and `--base + --n` trajectories; the difference over `--n` is the
instructions per trajectory (start-up and imports cancel out). Prints both paths, the service's
extra, and direct ÷ service: what `queue_overhead.py`'s ratio would be if the event loop's
instructions were all that mattered (it leaves out cache misses, Redis's own core, and waits).
The service child leaves its Redis keys; this process deletes them, outside the count.

    python benchmarks/queue_instructions.py --n 1000        # ~2-3 minutes on 2 cores; needs valgrind
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent


async def child(mode: str, n: int, redis_url: str, prefix: str) -> None:
    sys.path.insert(0, str(HERE))
    from queue_overhead import direct, service

    from rollout_service.runtime import tune_gc

    tune_gc()
    if mode == "direct":
        await direct(n, 32)
    else:
        await service(n, 32, redis_url, keep_prefix=prefix)


def count(mode: str, n: int, redis_url: str, prefix: str, tree: Path) -> int:
    """Instructions of one child run under callgrind, with the service's code from `tree`."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out", sys.executable, __file__,
               "--child", mode, "--n", str(n), "--redis-url", redis_url, "--prefix", prefix]
        got = subprocess.run(cmd, capture_output=True, text=True, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)})
    m = re.search(r"Collected\s*:\s*(\d+)", got.stderr)
    if got.returncode != 0 or m is None:
        raise SystemExit(f"valgrind run failed ({mode}, n={n}):\n{got.stderr[-2000:]}")
    return int(m.group(1))


async def drop(redis_url: str, prefix: str) -> None:
    import redis.asyncio as aioredis

    r = aioredis.from_url(redis_url)
    async for k in r.scan_iter(match=f"{prefix}*", count=1000):
        await r.unlink(k)
    await r.aclose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1000, help="trajectories counted (the difference of two runs)")
    ap.add_argument("--base", type=int, default=300, help="trajectories of the shorter run")
    ap.add_argument("--redis-url", default=os.environ.get("ROLLOUT_REDIS_URL", "redis://127.0.0.1:6379/0"))
    ap.add_argument("--out", default="benchmarks/results/queue_instructions.json")
    ap.add_argument("--tree", default=str(HERE.parent),
                    help="a checkout whose service code is counted (default: this one): before/after a change")
    ap.add_argument("--child", choices=["direct", "service"], help=argparse.SUPPRESS)
    ap.add_argument("--prefix", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        asyncio.run(child(a.child, a.n, a.redis_url, a.prefix))
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt install valgrind)")
    runs = [(mode, n, f"bench:{os.getpid()}-{mode}-{n}:") for mode in ("direct", "service") for n in (a.base, a.base + a.n)]
    try:  # two at a time: the counts do not depend on what else runs
        with ThreadPoolExecutor(2) as pool:
            got = list(pool.map(lambda r: count(r[0], r[1], a.redis_url, r[2], Path(a.tree).resolve()), runs))
    finally:
        for _, _, prefix in runs:
            asyncio.run(drop(a.redis_url, prefix))
    per: dict[str, float] = {}
    for mode, (short, long) in (("direct", got[:2]), ("service", got[2:])):
        per[mode] = (long - short) / a.n
        print(f"{mode:7s} instructions per trajectory: {per[mode]:,.0f}", flush=True)
    head = subprocess.run(["git", "-C", a.tree, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    res = {"commit": head.stdout.strip() or None, "n": a.n, "base": a.base, "direct_instructions_per_trajectory": per["direct"],
           "service_instructions_per_trajectory": per["service"],
           "service_extra_instructions_per_trajectory": per["service"] - per["direct"],
           "direct_over_service": per["direct"] / per["service"]}
    print(f"service's extra per trajectory: {res['service_extra_instructions_per_trajectory']:,.0f}")
    print(f"ratio direct/service (instructions): {res['direct_over_service']:.3f}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
