"""How far the allocator's estimate is from the simulator, layout by layout: its calibration.

The allocator moves engines when its estimate (`Allocator.estimate`: the seconds a layout needs
for the next horizon's demand) says another layout is faster. Before tuning when it moves, this
measures whether the estimate ranks layouts as the simulator runs them. For each model × workload
× mode × GPUs × seed:

- the rollout phase before (guided, another seed, as in `pd_allocation.py`) gives the measured
  step model and the forecaster's statistics;
- colocated then runs under the guided control loop held still (`Policy.held`), which keeps every
  decision's demand and measured capacity: once with our forecaster, once told the true demand;
- colocated and every static split run as in `pd_allocation.py`;
- a layout's estimated ratio to colocated is Σ over the decisions of its estimate ÷ Σ of
  colocated's, set beside the simulated ratio of makespans: the default estimate with our
  forecast and with the true demand, and the closed-loop estimate (`AllocatorConfig.estimate`)
  with our forecast.

Prints per cell and seed the simulated/estimated ratio of every split, and whether the layout the
estimate ranks first (colocated included) runs within 2% of the simulated best; then, per model,
the median of a split's estimated ÷ simulated ratio (its lean: above 1, splits priced slow), and
over all cells the median |log(estimated / simulated)| and that count, for each of the three.
Writes JSON.

    python benchmarks/pd_estimate.py --models qwen2.5-32b-tp2 --gpus 8 --seeds 0
    python benchmarks/pd_estimate.py --models llama3-8b-tp1,qwen3-30b-a3b-dp8ep8 --gpus 8,32 --modes async
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from benchmarks.pd_allocation import code_version, engine_workload, phase_before, splits  # noqa: E402
from benchmarks.sim.cluster import Cluster, Policy  # noqa: E402
from benchmarks.sim.cost import PRESETS, ClusterCost  # noqa: E402
from benchmarks.sim.workload import WORKLOADS  # noqa: E402
from scheduler.allocator import Allocator, Layout  # noqa: E402

NEAR = 0.02  # "within 2% of the best", as the PD table counts it


def estimated(c: Cluster, layouts: list[Layout], estimate: str = "throughput") -> dict[Layout, float]:
    """Σ over a held run's decisions of each layout's estimate (`AllocatorConfig.estimate`),
    relative to colocated's."""
    n = len(c.gpus)
    colo = Layout(0, 0, n)
    total = dict.fromkeys(layouts, 0.0)
    config = dataclasses.replace(c.allocator.config, estimate=estimate)
    for _, demand, capacity in c.decisions:
        if not demand.live:
            continue
        a = Allocator(c.gpus, capacity, config)
        est = {lay: a.estimate(lay, demand) for lay in layouts}
        if all(math.isfinite(v) for v in est.values()):
            for lay, v in est.items():
                total[lay] += v
    return {lay: v / total[colo] if total[colo] else math.nan for lay, v in total.items()}


def run_seed(workload: str, mode: str, engines: int, seed: int, cost: ClusterCost) -> dict:
    wl = engine_workload(workload, cost)
    warm = phase_before(wl, engines, mode, seed, cost)
    colo = Cluster(wl, engines, Policy.colocated(), mode, seed=seed, cost=cost).run().makespan_s
    ps = splits(engines)
    layouts = [Layout(0, 0, engines)] + [Layout(p, engines - p, 0) for p in ps]
    simulated = {0: 1.0} | {p: Cluster(wl, engines, Policy.static(p), mode, seed=seed, cost=cost).run().makespan_s / colo
                            for p in ps}
    out = {"seed": seed, "colocated_s": colo, "simulated": simulated}
    for perfect in (False, True):
        held = Cluster(wl, engines, Policy.held(perfect), mode, seed=seed, cost=cost, warm=warm)
        r = held.run()
        if r.makespan_s != colo:  # held still, it is colocated: anything else is a bug in the loop
            raise RuntimeError(f"held run {r.makespan_s} s differs from colocated {colo} s")
        est = estimated(held, layouts)
        out["true_demand" if perfect else "forecast"] = {lay.prefill: est[lay] for lay in layouts}
        if not perfect:
            est = estimated(held, layouts, "closed_loop")
            out["closed_loop"] = {lay.prefill: est[lay] for lay in layouts}
    return out


def judge(sim: dict[int, float], est: dict[int, float]) -> tuple[list[float], float]:
    """(|log(est/sim)| per split, what the estimate's first choice runs at ÷ the simulated best)."""
    errs = [abs(math.log(est[p] / sim[p])) for p in sim if p and est[p] > 0 and math.isfinite(est[p])]
    pick = min(est, key=lambda p: (est[p], p))
    return errs, sim[pick] / min(sim.values())


COLUMNS = (("forecast", "our forecast"), ("true_demand", "the true demand"),
           ("closed_loop", "our forecast, closed-loop estimate"))


def line(cell: dict, run: dict) -> str:
    sim, keys = run["simulated"], [k for k, _ in COLUMNS]
    parts = " ".join(f"{p}P {sim[p]:.2f}/" + "/".join(f"{run[k][p]:.2f}" for k in keys) for p in sim if p)
    got = " / ".join(f"{judge(sim, run[k])[1]:.3f}" for k in keys)
    return (f"{cell['model']} {cell['workload']:6s} {cell['mode']:5s} {cell['gpus']:3d} GPUs seed {run['seed']}: "
            f"split/colocated simulated/forecast/true-demand/closed-loop {parts}  first choice runs at {got} of the best")


def summary(cells: list[dict]) -> list[str]:
    out = []
    for model in dict.fromkeys(c["model"] for c in cells):  # the estimate's lean, per model: >1 is a split priced slow
        for key, _ in COLUMNS:
            logs = [math.log(run[key][p] / run["simulated"][p]) for c in cells if c["model"] == model
                    for run in c["seeds"] for p in run["simulated"] if p and run[key][p] > 0]
            if logs:
                out.append(f"{model} ({key.replace('_', ' ')}): a split's estimate / simulated, median "
                           f"{math.exp(statistics.median(logs)):.2f}x (quartiles "
                           f"{math.exp(_quantile(logs, 0.25)):.2f}-{math.exp(_quantile(logs, 0.75)):.2f}x)")
    for key, label in COLUMNS:
        errs, got = [], []
        for cell in cells:
            for run in cell["seeds"]:
                e, g = judge(run["simulated"], run[key])
                errs += e
                got.append(g)
        near = sum(g <= 1 + NEAR for g in got)
        out.append(f"estimate with {label}: median |log(estimated/simulated)| {statistics.median(errs):.3f} "
                   f"over {len(errs)} splits; its first choice within {NEAR:.0%} of the best in {near}/{len(got)} "
                   f"cell-seeds ({near / len(got):.0%}), worst {max(got):.2f}x")
    return out


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(int(q * len(xs)), len(xs) - 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="llama3-8b-tp1,qwen2.5-32b-tp2")
    ap.add_argument("--gpus", default="8")
    ap.add_argument("--modes", default="sync,async")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--out", default="benchmarks/results/pd_estimate.json")
    a = ap.parse_args()
    for m in a.models.split(","):
        if m not in PRESETS:
            ap.error(f"unknown model {m!r}; one of {', '.join(PRESETS)}")
    for w in a.workloads.split(","):
        if w not in WORKLOADS:
            ap.error(f"unknown workload {w!r}; one of {', '.join(WORKLOADS)}")
    for m in a.modes.split(","):
        if m not in ("sync", "async"):
            ap.error(f"unknown mode {m!r}; sync or async")
    try:
        sizes = [int(g) for g in a.gpus.split(",")]
        seeds = [int(s) for s in a.seeds.split(",")]
    except ValueError as e:
        ap.error(f"--gpus and --seeds take whole numbers, comma-separated ({e})")
    code, cells, t0 = code_version(), [], time.perf_counter()
    for model, workload, mode, gpus in itertools.product(a.models.split(","), a.workloads.split(","),
                                                         a.modes.split(","), sizes):
        cost = PRESETS[model]()
        engines = gpus // cost.gpus
        if engines < 2:
            continue
        cell = {"model": model, "workload": workload, "mode": mode, "gpus": gpus, "engines": engines, "code": code,
                "seeds": []}
        for s in seeds:
            run = run_seed(workload, mode, engines, s, cost)
            cell["seeds"].append(run)
            print(line(cell, run), flush=True)
        cells.append(cell)
    for s in summary(cells):
        print(s, flush=True)
    print(f"wall time {time.perf_counter() - t0:.0f}s")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": {k: v for k, v in vars(a).items() if k != "out"}, "code": code,
                               "cells": cells}, indent=1))


if __name__ == "__main__":
    main()
