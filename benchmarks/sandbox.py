"""What a sandbox costs: cold start, and a trivial bash tool call, p50/p99, per backend;
then, for bwrap, a first tool call from the warm pool vs cold, and env steps/s.

Baseline in the same run: the same trivial command as a plain host subprocess (no sandbox).
For each backend it measures
  - cold start: create the sandbox and run `true` in it (what a trajectory's first tool call pays),
  - bash call: `echo hi` through a warm `BashSession` (what every later tool call pays),
and prints one line per figure plus the ratio to the baseline. For bwrap it then measures
  - pool start: acquire a sandbox through `env_workers.resources.Pools` and run the first bash
    call, from a pre-warmed pool (bash already running) vs an empty one (created on demand),
  - env steps/s: N concurrent `swe` trajectories (threads, as the env worker runs them), each
    a full episode (run the tests, fix the bug, submit: 3 steps, 3 bash/tool calls, 2 test runs),
    for each N in --concurrency; baseline N = 1 in the same run,
and writes JSON.

    python benchmarks/sandbox.py --n 40 --backends bwrap,docker --concurrency 1,8,32

The docker backend uses ROLLOUT_DOCKER_URL if set, else starts podman's Docker API service
for the run (see rollout_service/local/podman.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from env_workers.resources import Pools, PoolSize
from env_workers.sandbox import Limits
from env_workers.sandbox.pool import SandboxSpec
from env_workers.tools import BashSession


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def summary(xs: list[float]) -> dict:
    return {"n": len(xs), "p50_ms": pct(xs, 50) * 1e3, "p99_ms": pct(xs, 99) * 1e3,
            "mean_ms": statistics.fmean(xs) * 1e3}


def baseline(n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(["sh", "-c", "echo hi"], capture_output=True, check=True)
        out.append(time.perf_counter() - t0)
    return out


def measure(make, n: int, calls: int) -> dict[str, list[float]]:
    cold, call = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        sb = make()
        sb.exec(["true"])
        cold.append(time.perf_counter() - t0)
        sb.close()
    sb = make()
    bash = BashSession(sb)
    try:
        assert bash.run("echo warm").text == "warm\n"
        for _ in range(calls):
            t0 = time.perf_counter()
            r = bash.run("echo hi")
            call.append(time.perf_counter() - t0)
            assert r.text == "hi\n", r.text
    finally:
        bash.close()
        sb.close()
    return {"cold_start": cold, "bash_call": call}


def pool_start(n: int, warm: bool) -> list[float]:
    """First tool call of a trajectory through the pools: acquire + `true` in bash."""
    spec = SandboxSpec(Limits(timeout_s=30))
    pools = Pools(PoolSize(warm=2 if warm else 0, cap=8, wait_s=30))
    out = []
    try:
        for i in range(n):
            if warm:  # measure a warm hit: let the background refill finish first
                pools.prewarm(spec)
                deadline = time.monotonic() + 30
                while pools.pool(spec).stats()["idle"] < 2 and time.monotonic() < deadline:
                    time.sleep(0.005)
            t0 = time.perf_counter()
            box = pools.acquire(f"t{i}", spec)
            r = box.tools.call("bash", command="true")
            out.append(time.perf_counter() - t0)
            assert r.failure is None, r.text
            pools.release(f"t{i}")
    finally:
        pools.close()
    return out


def swe_episode(seed: int, claims) -> int:
    """One solved `swe` episode; returns the steps taken."""
    from env_workers.envs.swe import _BANK, SweEnv

    env = SweEnv(resources=claims)
    env.reset({"seed": seed})
    repo = env._repo
    old, new = next(b for _s, _t, bugs in _BANK.values() for fn, b, _ in bugs if fn == repo["function"])
    path = repo["module"].replace(".", "/") + ".py"
    steps = [env.step("```bash\npython3 -m unittest 2>&1 | tail -1\n```"),
             env.step(f"```replace {path}\n{new}\n=======\n{old}\n```"), env.step("submit")]
    env.close()
    assert steps[-1].reward == 1.0, steps[-1].observation
    return len(steps)


def env_steps(concurrency: int, episodes: int) -> dict:
    from env_workers.envs.swe import SPEC

    pools = Pools(PoolSize(warm=min(concurrency, 8), cap=concurrency + 8, wait_s=120))
    pools.prewarm(SPEC)
    time.sleep(1.0)  # let the warm set fill, as a running env worker's would be
    try:
        with ThreadPoolExecutor(concurrency) as ex:
            t0 = time.perf_counter()
            steps = sum(ex.map(lambda i: swe_episode(i, pools.claims(f"ep{i}")), range(episodes)))
            wall = time.perf_counter() - t0
    finally:
        pools.close()
    return {"concurrency": concurrency, "episodes": episodes, "steps": steps, "wall_s": wall,
            "steps_per_s": steps / wall, "episodes_per_s": episodes / wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=40, help="sandboxes started per backend")
    ap.add_argument("--calls", type=int, default=200, help="bash tool calls per backend")
    ap.add_argument("--backends", default="bwrap,docker")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--concurrency", default="1,8,32", help="concurrent swe trajectories for env steps/s (bwrap)")
    ap.add_argument("--episodes", type=int, default=2, help="episodes per concurrent trajectory (at least 8 in all)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "sandbox.json"))
    a = ap.parse_args()
    random.seed(a.seed)  # nothing random is drawn today; kept so later figures stay reproducible

    results: dict = {"baseline_subprocess": summary(baseline(a.calls))}
    base = results["baseline_subprocess"]["p50_ms"]
    print(f"baseline host subprocess (sh -c 'echo hi'): p50 {base:.1f} ms  p99 "
          f"{results['baseline_subprocess']['p99_ms']:.1f} ms")
    limits = Limits(timeout_s=30)
    with ExitStack() as stack:
        for backend in a.backends.split(","):
            if backend == "bwrap":
                from env_workers.sandbox.bwrap import BwrapSandbox

                def make():
                    return BwrapSandbox(limits)
            elif backend == "docker":
                import docker

                from env_workers.sandbox.docker import DockerSandbox
                from rollout_service.local import podman

                url = os.environ.get("ROLLOUT_DOCKER_URL")
                if not url:
                    folder = stack.enter_context(tempfile.TemporaryDirectory())
                    url = stack.enter_context(podman.PodmanService(folder)).url
                client = docker.DockerClient(base_url=url)
                stack.callback(client.close)
                image = podman.ensure_image(client)

                def make(client=client, image=image):
                    return DockerSandbox(client, image, limits)
            else:
                raise SystemExit(f"unknown backend {backend!r}")
            figures = {k: summary(v) for k, v in measure(make, a.n, a.calls).items()}
            results[backend] = figures
            for name, s in figures.items():
                print(f"{backend} {name.replace('_', ' ')}: p50 {s['p50_ms']:.1f} ms  p99 {s['p99_ms']:.1f} ms  "
                      f"({s['p50_ms'] / base:.2f}x a host subprocess)")
    if "bwrap" in a.backends.split(","):
        warm, cold = summary(pool_start(a.n, warm=True)), summary(pool_start(a.n, warm=False))
        results["bwrap"]["pool_start_warm"], results["bwrap"]["pool_start_cold"] = warm, cold
        print(f"bwrap first tool call from the warm pool: p50 {warm['p50_ms']:.1f} ms  p99 {warm['p99_ms']:.1f} ms  "
              f"(cold, empty pool: p50 {cold['p50_ms']:.1f} ms  p99 {cold['p99_ms']:.1f} ms; "
              f"warm/cold p50 {warm['p50_ms'] / cold['p50_ms']:.2f}x)")
        runs = []
        for n in (int(x) for x in a.concurrency.split(",")):
            runs.append(env_steps(n, max(8, n * a.episodes)))
            base_rate = runs[0]["steps_per_s"]
            print(f"swe env steps/s with {n} concurrent trajectories (bwrap): {runs[-1]['steps_per_s']:.1f} "
                  f"({runs[-1]['episodes']} episodes in {runs[-1]['wall_s']:.1f} s; "
                  f"{runs[-1]['steps_per_s'] / base_rate:.2f}x N={runs[0]['concurrency']})")
        results["swe_env_steps"] = runs
    results["args"] = vars(a)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(results, indent=2))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
