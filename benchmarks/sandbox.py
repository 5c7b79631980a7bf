"""What a sandbox costs: cold start, and a trivial bash tool call, p50/p99, per backend.

Baseline in the same run: the same trivial command as a plain host subprocess (no sandbox).
For each backend it measures
  - cold start: create the sandbox and run `true` in it (what a trajectory's first tool call pays),
  - bash call: `echo hi` through a warm `BashSession` (what every later tool call pays),
and prints one line per figure plus the ratio to the baseline, then writes JSON.

    python benchmarks/sandbox.py --n 40 --backends bwrap,docker

The docker backend uses ROLLOUT_DOCKER_URL if set, else starts podman's Docker API service
for the run (see env_workers/sandbox/podman.py). Warm-pool start is not measured yet: the
typed resource pools (scheduler/resources.py) do not exist.
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
from contextlib import ExitStack
from pathlib import Path

from env_workers.sandbox import Limits
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=40, help="sandboxes started per backend")
    ap.add_argument("--calls", type=int, default=200, help="bash tool calls per backend")
    ap.add_argument("--backends", default="bwrap,docker")
    ap.add_argument("--seed", type=int, default=0)
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

                from env_workers.sandbox import podman
                from env_workers.sandbox.docker import DockerSandbox

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
    results["args"] = vars(a)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(results, indent=2))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
