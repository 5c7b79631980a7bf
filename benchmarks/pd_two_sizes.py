"""Guided over a per-role launch: does moving roles within each engine size pay? One seeded run.

A per-role launch (`rollout launch-plan`: p prefill engines of TP a, d decode engines of TP b) is
chosen from the phase before; the allocator then moves engines between prefill and decode within
each size (`Allocator(sizes=...)`). For a dense model on `--gpus` GPUs, every per-role launch that
`scheduler.launch.candidates` names runs each workload, mode and seed twice, on the same
trajectories (`benchmarks/sim`):

- static: the roles as launched;
- guided: the service's allocator over the same engines, warm as a live deployment is: each size's
  step model from a guided phase at that size alone (uniform, another seed: where the planner's
  profiles come from) and the forecaster from the one at the decode engines' size.

Prints static/guided per cell and launch (above 1: guided faster), marks the launch that ran best
static in the cell (the one the planner aims for), and a summary over all launches and over the
best ones: median, range, and the share within 2% or better; writes JSON.

    python benchmarks/pd_two_sizes.py --gpus 8 --seeds 0
    python benchmarks/pd_two_sizes.py --gpus 8 --out docs/results/pd_two_sizes.json --table docs/results/pd_two_sizes.txt
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from benchmarks.pd_allocation import Said, code_version, engine_workload, save, spread  # noqa: E402
from benchmarks.pd_role_tp import FAMILIES, launch_name  # noqa: E402
from benchmarks.sim.cluster import Cluster, Policy, Warm  # noqa: E402
from benchmarks.sim.workload import WORKLOADS  # noqa: E402
from scheduler.launch import candidates  # noqa: E402


def run_seed(model: str, workload: str, mode: str, gpus: int, seed: int, tps: list[int], most: int) -> dict:
    label, make = FAMILIES[model]
    costs = {t: make(t) for t in tps}
    in_flight = round(WORKLOADS[workload].per_gpu * gpus)
    wl = {t: engine_workload(workload, costs[t]) for t in tps}
    phase = {}  # the phase before at each size alone: its measured step model and forecaster
    for t in tps:
        if gpus // t >= 1 and gpus % t == 0:
            before = Cluster(wl[t], gpus // t, Policy.guided(), mode, seed=seed + 1000, cost=costs[t], in_flight=in_flight)
            before.run()
            phase[t] = before
    launches = {}
    for c in candidates(gpus, tps, most):
        if not c.prefill_size or c.prefill_size not in phase or c.size not in phase:
            continue
        name = launch_name(c, label)
        n, pc = c.prefill + c.decode, costs[c.prefill_size]
        static = Cluster(wl[c.size], n, Policy.static(c.prefill, name), mode, seed=seed, cost=costs[c.size],
                         prefill_cost=pc, in_flight=in_flight).run()
        dec = phase[c.size]
        warm = Warm(dec.capacity, dec.forecaster, None,
                    {c.size: phase[c.size].capacity, c.prefill_size: phase[c.prefill_size].capacity}, None)
        guided = Cluster(wl[c.size], n, Policy.guided(), mode, seed=seed, cost=costs[c.size], prefill_cost=pc,
                         in_flight=in_flight, prefill_engines=c.prefill, warm=warm).run()
        launches[name] = {"static_s": static.makespan_s, "guided_s": guided.makespan_s, "moves": guided.moves}
    best = min(launches, key=lambda k: launches[k]["static_s"]) if launches else None
    return {"seed": seed, "in_flight": in_flight, "launches": launches, "best_static": best, "code": code_version()}


def cell_lines(c: dict) -> list[str]:
    runs = c["seeds"]
    head = f"{c['model']} {c['workload']:6s} {c['mode']:5s} {c['gpus']:3d} GPUs"
    best = statistics.mode([r["best_static"] for r in runs])
    out = []
    for name in runs[0]["launches"]:
        s = spread([r["launches"][name]["static_s"] / r["launches"][name]["guided_s"] for r in runs])
        moves = statistics.median(r["launches"][name]["moves"] for r in runs)
        mark = " (best static)" if name == best else ""
        out.append(f"{head} {name:18s} static/guided {s['median']:.2f}x [{s['min']:.2f}-{s['max']:.2f}]  "
                   f"moves {moves:.0f}{mark}")
    return out


def report(cells: list[dict], wall: float, say) -> None:
    say("")
    every, best = [], []
    for c in cells:
        runs = c["seeds"]
        top = statistics.mode([r["best_static"] for r in runs])
        for name in runs[0]["launches"]:
            x = statistics.median(r["launches"][name]["static_s"] / r["launches"][name]["guided_s"] for r in runs)
            every.append(x)
            if name == top:
                best.append(x)
    for what, xs in (("every per-role launch", every), ("the best static launch of each cell", best)):
        if xs:
            say(f"{what:36s} cells {len(xs):3d}  static/guided median {statistics.median(xs):.2f}x "
                f"({min(xs):.2f}-{max(xs):.2f}), >= 0.98x in {sum(x >= 0.98 for x in xs)}/{len(xs)}, "
                f"> 1.02x in {sum(x > 1.02 for x in xs)}")
    say(f"wall time {wall:.0f}s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-32b", help=f"a dense model: {sorted(m for m in FAMILIES if FAMILIES[m][0] == 'tp')}")
    ap.add_argument("--tps", default="1,2,4", help="the sizes an engine may have (TP)")
    ap.add_argument("--workloads", default="math,coding,swe,mix,web,doc,reason,shift,grpo")
    ap.add_argument("--modes", default="sync,async")
    ap.add_argument("--gpus", default="8")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--max-per-pair", type=int, default=3, help="per-role launches tried per (prefill TP, decode TP)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "pd_two_sizes.json"))
    ap.add_argument("--table", default="", help="also write the printed lines here")
    a = ap.parse_args()
    if a.model not in FAMILIES or FAMILIES[a.model][0] != "tp":
        ap.error("--model: a dense model (the MoE's per-role groups are not modelled below DP8)")
    tps = [int(t) for t in a.tps.split(",")]
    say = Said()

    t0 = time.time()
    cells = []
    for g in [int(x) for x in a.gpus.split(",")]:
        for w in a.workloads.split(","):
            for m in a.modes.split(","):
                runs = [run_seed(a.model, w, m, g, int(s), tps, a.max_per_pair) for s in a.seeds.split(",")]
                cells.append({"model": a.model, "workload": w, "mode": m, "gpus": g, "seeds": runs})
                for line in cell_lines(cells[-1]):
                    say(line)
    report(cells, time.time() - t0, say)
    save(a.out, {"args": vars(a), "wall_s": time.time() - t0, "cells": cells}, a.table, say)


if __name__ == "__main__":
    main()
