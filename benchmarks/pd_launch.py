"""Does choosing the launch (each role's engine size, and how many of each) from the phase before pay?

`benchmarks/pd_role_tp.py` ran every launch of a cell — colocated and every static split at each
engine size, and every split whose prefill and decode engines differ in size — and wrote each one's
makespan per seed. This script plays the deployment that must pick one before the phase starts,
with what it could have measured in the rollout phase before (same workload, seed + 1000):

- a step model per engine size, fitted to the steps of that phase run at that size (colocated,
  under the guided control loop that measures and never moves: `Policy.held`): a deployment that
  ran one phase at each size; or, `calibrated`, the cost model's own steps (`ClusterCost.prior`:
  the H200 measurements the simulator runs on) for every size;
- the demand the forecaster saw at each decision of that phase at a base size (`--base`).

`kept` is `measured` where the pick's estimate beats colocation at the base size by the share a
role move must win (`AllocatorConfig.min_gain`, 10%), and colocation at the base size otherwise.

`scheduler.launch.plan` ranks the cell's launches by the allocator's estimate summed over those
demands; its first pick's makespan is read from the table (the same seed, the same trajectories).
Prints per cell the pick and its speed against the table's best launch (a hindsight oracle: 1.00x
at best), against colocation at the base size and against guided at the base size (roles moved
within that launch), and a summary line per model and GPU count; writes JSON.

    python benchmarks/pd_launch.py --table-json docs/results/pd_role_tp.json --models llama3-8b --gpus 8 --seeds 0
    python benchmarks/pd_launch.py --table-json docs/results/pd_role_tp.json --out docs/results/pd_launch.json \\
        --table docs/results/pd_launch.txt
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from benchmarks.pd_allocation import Said, code_version, engine_workload, save, spread  # noqa: E402
from benchmarks.pd_role_tp import FAMILIES, launch_of  # noqa: E402
from benchmarks.sim.cluster import Cluster, Policy  # noqa: E402
from benchmarks.sim.cost import ClusterCost  # noqa: E402
from scheduler.allocator import AllocatorConfig  # noqa: E402
from scheduler.capacity import Capacity  # noqa: E402
from scheduler.launch import plan  # noqa: E402

def calibrated(cost: ClusterCost) -> Capacity:
    """The cost model's own step model, in the allocator's form."""
    return Capacity(step=cost.prior(), kv_tokens=cost.kv_capacity_tokens, chunk_tokens=cost.step_tokens,
                    rank_tokens=cost.prefill_chunk_tokens)


def measure_phase(model: str, workload: str, mode: str, gpus: int, seed: int, sizes: list[int],
                  in_flight: int, offset: int = 1000) -> dict:
    """The phase before (seed + `offset`; 0: this very phase, hindsight) at each size, colocated and
    held, with the table's trajectories in flight (so `--scale` needs no repeating): {size: (its fitted capacity, each decision's demand)}."""
    make = FAMILIES[model][1]
    out = {}
    for t in sizes:
        cost = make(t)
        c = Cluster(engine_workload(workload, cost), gpus // t, Policy.held(), mode, seed=seed + offset,
                    cost=cost, in_flight=in_flight)
        c.run()
        out[t] = (c.capacity, [d for _, d, _ in c.decisions])
    return out


def run_seed(model: str, cell: dict, run: dict, sizes: list[int], base: list[int], offset: int = 1000) -> dict:
    """One seed of a table's cell: the phase before measured at every size, and the pick from each base."""
    gpus, label = cell["gpus"], FAMILIES[model][0]
    table = {**run["uniform"], **run["per_role"]}
    launches = {n: launch_of(n, gpus) for n in table}
    phase = measure_phase(model, cell["workload"], cell["mode"], gpus, run["seed"], sizes, run["in_flight"], offset)
    profiles = {"measured": {t: cap for t, (cap, _) in phase.items()},
                "calibrated": {t: calibrated(FAMILIES[model][1](t)) for t in sizes}}
    config = AllocatorConfig(response_kv_pushed=True)  # the simulator's engines push the response KV back
    best = min(table, key=table.get)
    picks = {}
    for b in base:
        demands = phase[b][1]
        for source, prof in profiles.items():
            ranked = plan(launches.values(), demands, prof, config)
            est = {next(n for n, lay in launches.items() if lay == c): sec for c, sec in ranked}
            name, now = next(iter(est)), f"colocated@{label}{b}"
            picks[f"{source}@{label}{b}"] = {"launch": name, "makespan_s": table[name], "decisions": len(demands),
                                             "estimated_gain": est[now] / est[name]}
            if source == "measured":  # relaunch only for a gain a role move would need too (`min_gain`)
                keep = est[name] > (1.0 - config.min_gain) * est[now]
                picks[f"kept@{label}{b}"] = {**picks[f"{source}@{label}{b}"], "launch": now if keep else name,
                                             "makespan_s": table[now if keep else name]}
    return {"seed": run["seed"], "best": best, "best_s": table[best], "picks": picks,
            "colocated": {f"{label}{b}": run["uniform"][f"colocated@{label}{b}"] for b in base},
            "guided": {f"{label}{b}": run["guided"].get(f"guided@{label}{b}") for b in base},
            "code": code_version()}


def ratios(runs: list[dict], pick: str, against) -> dict:
    return spread([against(r) / r["picks"][pick]["makespan_s"] for r in runs if against(r)])


def cell_line(c: dict) -> str:
    runs = c["seeds"]
    s = f"{c['model']} {c['workload']:6s} {c['mode']:5s} {c['gpus']:3d} GPUs: best {statistics.mode(r['best'] for r in runs):18s}"
    for pick in runs[0]["picks"]:
        size = pick.split("@")[1]
        name = statistics.mode(r["picks"][pick]["launch"] for r in runs)
        o = ratios(runs, pick, lambda r: r["best_s"])
        co = ratios(runs, pick, lambda r, z=size: r["colocated"][z])
        s += f" | {pick}: {name:18s} of best {o['median']:.2f}x [{o['min']:.2f}-{o['max']:.2f}] over coloc {co['median']:.2f}x"
        if runs[0]["guided"].get(size):
            g = ratios(runs, pick, lambda r, z=size: r["guided"][z])
            s += f" over guided {g['median']:.2f}x"
    return s


def report(cells: list[dict], wall: float, say) -> None:
    say("")
    for model, g in dict.fromkeys((c["model"], c["gpus"]) for c in cells):
        cs = [c for c in cells if (c["model"], c["gpus"]) == (model, g)]
        for pick in cs[0]["seeds"][0]["picks"]:
            size = pick.split("@")[1]
            of_best = [ratios(c["seeds"], pick, lambda r: r["best_s"])["median"] for c in cs]
            coloc = [ratios(c["seeds"], pick, lambda r, z=size: r["colocated"][z])["median"] for c in cs]
            line = (f"{model} at {g} GPUs, {len(cs)} cells, {pick}: of the best launch median "
                    f"{statistics.median(of_best):.2f}x ({min(of_best):.2f}-{max(of_best):.2f}), within 2% in "
                    f"{sum(x >= 0.98 for x in of_best)}/{len(cs)}; over colocated at {size} median "
                    f"{statistics.median(coloc):.2f}x ({min(coloc):.2f}-{max(coloc):.2f})")
            if cs[0]["seeds"][0]["guided"].get(size):
                gd = [ratios(c["seeds"], pick, lambda r, z=size: r["guided"][z])["median"] for c in cs]
                line += f"; over guided at {size} median {statistics.median(gd):.2f}x ({min(gd):.2f}-{max(gd):.2f})"
            say(line)
    say(f"wall time {wall:.0f}s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table-json", default="docs/results/pd_role_tp.json", help="what pd_role_tp.py wrote")
    ap.add_argument("--models", default="", help="comma list (default: every model in the table)")
    ap.add_argument("--gpus", default="", help="comma list (default: every GPU count in the table)")
    ap.add_argument("--workloads", default="", help="comma list (default: all)")
    ap.add_argument("--modes", default="", help="comma list (default: both)")
    ap.add_argument("--seeds", default="", help="comma list (default: the table's)")
    ap.add_argument("--base", default="", help="sizes whose phase's demand is planned on, by model: "
                    "model=2,4;model=1 (default: the sizes the table ran guided at)")
    ap.add_argument("--phase-offset", type=int, default=1000, help="the phase planned on: the table's seed plus this "
                    "(default 1000: another phase of the same workload; 0: the same phase, a hindsight bound)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "pd_launch.json"))
    ap.add_argument("--table", default="", help="also write the printed lines here")
    a = ap.parse_args()
    src = json.loads(Path(a.table_json).read_text())
    pick = {k: set(getattr(a, k if k == "gpus" else f"{k}s").split(",")) - {""} for k in ("model", "gpus", "workload", "mode", "seed")}
    bases = {m: [int(t) for t in ts.split(",")] for m, ts in (x.split("=") for x in a.base.split(";") if x)}
    say = Said()

    t0 = time.time()
    cells = []
    for cell in src["cells"]:
        model = cell["model"]
        if any(v and str(cell[k]) not in v for k, v in pick.items() if k != "seed"):
            continue
        runs = [r for r in cell["seeds"] if not pick["seed"] or str(r["seed"]) in pick["seed"]]
        if not runs or not runs[0]["per_role"]:
            continue
        label = FAMILIES[model][0]
        sizes = sorted({launch_of(n, cell["gpus"]).size for n in runs[0]["uniform"]})
        base = bases.get(model) or [int(g.split(label)[-1]) for g in runs[0]["guided"]] or sizes[:1]
        out = [run_seed(model, cell, r, sizes, base, a.phase_offset) for r in runs]
        cells.append({k: cell[k] for k in ("model", "workload", "mode", "gpus")} | {"seeds": out})
        say(cell_line(cells[-1]))
    if not cells:
        ap.error("no cell of the table matches")
    report(cells, time.time() - t0, say)
    save(a.out, {"args": vars(a), "wall_s": time.time() - t0, "cells": cells}, a.table, say)


if __name__ == "__main__":
    main()
