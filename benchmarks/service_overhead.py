"""The same multi-turn episodes, direct to vLLM and through the service, side by side.

Direct: the multi-turn loop (`run_episode`) in this process, calling the vLLM server and
in-process environments: what a researcher's own harness would do. Service: the same
tasks submitted to `rollout up` (gateway, Redis queue, worker, env worker over HTTP)
pointed at the same vLLM server. Greedy sampling and the same seeds make both produce the
same turns, so per-trajectory differences are the service's overhead.

Prints generated tokens/s for both and the ratio, and p50/p99 added latency per turn;
writes JSON. Runs alternate (direct, service, direct, ...) and medians are reported.

    python benchmarks/service_overhead.py --model tiny --episodes 16 --repeats 3
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

from env_workers.client import LocalEnvs
from rollout_service.engines.fleet import Fleet
from rollout_service.engines.vllm import VLLMEngine
from rollout_service.local import vllm_local
from rollout_service.rollout import run_episode
from scheduler.store import Work
from trainer_client import RolloutClient
from wire import RolloutRequest, SamplingParams, Trajectory

sys.path.insert(0, str(Path(__file__).parent))
from _up import start_up  # noqa: E402


def params(a) -> RolloutRequest:
    return RolloutRequest(tasks=[{}], env="calc", max_turns=a.turns,
                          sampling=SamplingParams(temperature=0.0, max_tokens=a.max_tokens))


def tasks(a) -> list[dict]:
    return [{"seed": 1000 + i} for i in range(a.episodes)]


async def direct(a, url: str, model: str, tokenizer: str) -> tuple[float, dict[int, Trajectory]]:
    fleet = Fleet({"vllm": (VLLMEngine("vllm", url, model), tokenizer)})
    p, sem = params(a), asyncio.Semaphore(a.concurrency)

    async def one(i: int, task: dict) -> tuple[int, Trajectory]:
        async with sem:
            return i, await run_episode(Work(f"d-{i}", "d", i, 0, task, p), fleet, LocalEnvs())

    t0 = time.perf_counter()
    got = dict(await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks(a)))))
    wall = time.perf_counter() - t0
    await fleet.aclose()
    return wall, got


def service(a, gateway: str) -> tuple[float, dict[int, Trajectory]]:
    p = params(a)
    with RolloutClient(gateway, timeout=60) as c:
        t0 = time.perf_counter()
        b = c.submit(tasks(a), env="calc", sampling=p.sampling, max_turns=a.turns)
        got = {t.group_index: t for t in c.iter_results(b.id)}
        return time.perf_counter() - t0, got


def gen_tokens(trajs: dict[int, Trajectory]) -> int:
    return sum(len(t.output_ids) for traj in trajs.values() for t in traj.turns)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", choices=["tiny", "smollm2"], help="local vLLM model (default tiny)")
    ap.add_argument("--engine-url", help="use this running vLLM server (with --served-name, --tokenizer)")
    ap.add_argument("--served-name", default=None)
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--redis-url", default=os.environ.get("ROLLOUT_REDIS_URL", "redis://127.0.0.1:6379/0"))
    ap.add_argument("--out", default="benchmarks/results/service_overhead.json")
    a = ap.parse_args()

    server = None
    if a.engine_url:
        url, model, tokenizer = a.engine_url, a.served_name or "default", a.tokenizer or "byte"
    else:
        path = vllm_local.prepare_model(a.model)
        port = 18500 + os.getpid() % 400
        server = vllm_local.start_server(path, port, a.model)
        url, model, tokenizer = f"http://127.0.0.1:{port}", a.model, str(path)
        print(f"vLLM ({a.model}) ready in {vllm_local.wait_ready(url, 300, server):.0f} s", file=sys.stderr)
    up, gw = start_up(a.redis_url, "--engine-url", url, "--model", model, "--tokenizer", tokenizer,
                      env={"ROLLOUT_WORKER_CONCURRENCY": str(a.concurrency)})
    try:
        d_tps, s_tps, added = [], [], []
        for r in range(a.repeats):
            d_wall, d = asyncio.run(direct(a, url, model, tokenizer))
            s_wall, s = service(a, gw)
            d_tps.append(gen_tokens(d) / d_wall)
            s_tps.append(gen_tokens(s) / s_wall)
            for i, sd in s.items():  # same seed, greedy: same turns; compare active time per turn
                if len(sd.turns) == len(d[i].turns) and sd.turns:
                    added.append((sd.active_s - d[i].active_s) / len(sd.turns) * 1000)
            print(f"run {r}: direct {d_tps[-1]:.1f} tok/s, service {s_tps[-1]:.1f} tok/s", file=sys.stderr)
    finally:
        up.terminate()
        up.wait(30)
        if server is not None:
            vllm_local.stop_server(server)
    added.sort()
    res = {"model": model, "episodes": a.episodes, "turns": a.turns, "max_tokens": a.max_tokens,
           "concurrency": a.concurrency, "repeats": a.repeats,
           "direct_gen_tok_per_s": statistics.median(d_tps), "service_gen_tok_per_s": statistics.median(s_tps),
           "added_ms_per_turn_p50": added[len(added) // 2] if added else None,
           "added_ms_per_turn_p99": added[min(len(added) - 1, int(len(added) * 0.99))] if added else None}
    res["service_over_direct"] = res["service_gen_tok_per_s"] / res["direct_gen_tok_per_s"]
    print(f"direct  generated tokens/s (median of {a.repeats}): {res['direct_gen_tok_per_s']:.1f}")
    print(f"service generated tokens/s (median of {a.repeats}): {res['service_gen_tok_per_s']:.1f}")
    print(f"ratio service/direct: {res['service_over_direct']:.3f}")
    print(f"added latency per turn p50: {res['added_ms_per_turn_p50']:.1f} ms")
    print(f"added latency per turn p99: {res['added_ms_per_turn_p99']:.1f} ms")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
