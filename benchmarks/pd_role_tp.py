"""Does giving prefill and decode engines their own tensor parallelism pay? One seeded run.

Issue 15 asks for per-role parallelism: a split whose prefill engines run at one TP and its
decode engines at another (a 32B prefilling at TP4 for decode engines at TP2, say; for the MoE, a
DP-attention group of 8 prefilling for decode groups of 16). For a model on `--gpus` GPUs, each
seed runs the same episodes (`benchmarks/sim`, the same trajectories in flight on every layout)
under:

- every uniform layout: colocated, and every static split (as `pd_allocation.py` picks them), at
  each TP of `--tps` that leaves at least one engine (colocated) or two (a split);
- every per-role split: p prefill engines at TP a and d decode engines at TP b, a != b, that use
  all the GPUs (p·a + d·b = GPUs), up to `--max-per-pair` of them per (a, b), spread over the
  prefill share;
- guided (`pd_allocation.py`'s guided column, warm from the phase before) at each TP of `--base`:
  the service's allocator moves roles, not TP, so an engine keeps the TP it was launched with.

Prints per cell the best uniform layout, the best per-role split and their speed ratio (above 1:
the per-role split is faster), and each guided run's speed over the best per-role split (above 1:
guided is faster); a summary line per GPU count; writes JSON. The base TP's colocated, static and
guided makespans are the ones `pd_allocation.py` gets for that preset (same seeds, same load,
where trajectories a GPU times `--scale` is whole, as at the default 1.0).

    python benchmarks/pd_role_tp.py --gpus 8 --seeds 0
    python benchmarks/pd_role_tp.py --gpus 8,32 --out docs/results/pd_role_tp.json --table docs/results/pd_role_tp.txt
    python benchmarks/pd_role_tp.py --model qwen3-30b-a3b --tps 8,16,32 --base 8,16 --gpus 32
    python benchmarks/pd_role_tp.py --render a.json,b.json --out all.json --table all.txt   # runs done in parts
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from benchmarks.pd_allocation import Said, code_version, engine_workload, phase_before, save, spread  # noqa: E402
from benchmarks.sim.cluster import Cluster, Policy  # noqa: E402
from benchmarks.sim.cost import ClusterCost  # noqa: E402
from benchmarks.sim.shape import MODELS  # noqa: E402
from benchmarks.sim.workload import WORKLOADS  # noqa: E402
from scheduler.launch import Launch, candidates  # noqa: E402

# what an engine of size n is, by model: (its label, its cost); a dense model's n is its TP, the
# MoE's its DP-attention group (`ClusterCost.moe_dp`: 8, 16 or 32 ranks)
FAMILIES = {m: ("tp", lambda n, shape=shape: ClusterCost.dense(shape, n)) for m, shape in MODELS.items()
            if "attn" not in m}
FAMILIES["qwen3-30b-a3b"] = ("dp", ClusterCost.moe_dp)


_UNIFORM = re.compile(r"^(?:colocated|(\d+)P(\d+)D)@[a-z]+(\d+)$")
_PER_ROLE = re.compile(r"^(\d+)P@[a-z]+(\d+)\+(\d+)D@[a-z]+(\d+)$")


def launch_name(c: Launch, label: str) -> str:
    """A launch as the table names it: colocated@tp4, 3P5D@tp4, 4P@tp1+1D@tp4 (`launch_of` reads it)."""
    if c.prefill_size:
        return f"{c.prefill}P@{label}{c.prefill_size}+{c.decode}D@{label}{c.size}"
    return f"{c.prefill}P{c.decode}D@{label}{c.size}" if c.prefill else f"colocated@{label}{c.size}"


def launch_of(name: str, gpus: int) -> Launch:
    """The launch a table name stands for (`launch_name`'s inverse)."""
    if m := _PER_ROLE.match(name):
        p, a, d, b = map(int, m.groups())
        return Launch(b, d, prefill=p, prefill_size=a)
    if m := _UNIFORM.match(name):
        p, d, t = m.groups()
        t = int(t)
        return Launch(t, 0, gpus // t) if p is None else Launch(t, int(d), prefill=int(p))
    raise ValueError(f"not a launch name: {name!r}")


def run_seed(model: str, workload: str, mode: str, gpus: int, seed: int, tps: list[int], base: list[int],
             most: int, scale: float) -> dict:
    label, make = FAMILIES[model]
    costs = {t: make(t) for t in tps}
    in_flight = round(WORKLOADS[workload].per_gpu * scale * gpus)
    wl = {t: engine_workload(workload, costs[t], scale) for t in tps}  # as pd_allocation.py runs each size

    def one(policy: Policy, t: int, engines: int, prefill_cost: ClusterCost | None = None, warm=None) -> float:
        return Cluster(wl[t], engines, policy, mode, seed=seed, cost=costs[t], warm=warm,
                       prefill_cost=prefill_cost, in_flight=in_flight).run().makespan_s

    uniform, per_role, guided = {}, {}, {}
    for c in candidates(gpus, tps, most):  # what the live planner ranks (`rollout launch-plan`)
        name = launch_name(c, label)
        if c.prefill_size:
            per_role[name] = one(Policy.static(c.prefill, name), c.size, c.prefill + c.decode,
                                 prefill_cost=costs[c.prefill_size])
        else:
            uniform[name] = one(Policy.static(c.prefill) if c.prefill else Policy.colocated(), c.size,
                                c.prefill + c.decode + c.mixed)
    for t in base:
        n = gpus // t
        if n >= 2:
            warm = phase_before(wl[t], n, mode, seed, costs[t])
            guided[f"guided@{label}{t}"] = one(Policy.guided(), t, n, warm=warm)
    bu, bp = min(uniform, key=uniform.get), min(per_role, key=per_role.get) if per_role else None
    return {"seed": seed, "in_flight": in_flight, "uniform": uniform, "per_role": per_role, "guided": guided,
            "best_uniform": bu, "best_uniform_s": uniform[bu], "best_per_role": bp,
            "best_per_role_s": per_role[bp] if bp else None, "code": code_version()}


def median_ratio(runs: list[dict], num, den) -> tuple[float, float, float]:
    s = spread([num(r) / den(r) for r in runs])
    return s["median"], s["min"], s["max"]


def cell_line(c: dict) -> str:
    runs = c["seeds"]
    head = f"{c['model']} {c['workload']:6s} {c['mode']:5s} {c['gpus']:3d} GPUs"
    if not runs[0]["per_role"]:
        return f"{head}: no per-role split fits"
    gain = median_ratio(runs, lambda r: r["best_uniform_s"], lambda r: r["best_per_role_s"])
    bu = statistics.mode([r["best_uniform"] for r in runs])
    bp = statistics.mode([r["best_per_role"] for r in runs])
    s = (f"{head}: best uniform {bu:16s} best per-role {bp:20s} per-role over uniform {gain[0]:.2f}x "
         f"[{gain[1]:.2f}-{gain[2]:.2f}]")
    for g in runs[0]["guided"]:
        vs = median_ratio(runs, lambda r: r["best_per_role_s"], lambda r, g=g: r["guided"][g])
        s += f"  {g} over best per-role {vs[0]:.2f}x [{vs[1]:.2f}-{vs[2]:.2f}]"
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-32b", help=f"one of {sorted(FAMILIES)}")
    ap.add_argument("--tps", default="1,2,4,8", help="the sizes an engine may have: its TP (a dense model) or its "
                    "DP-attention group (the MoE: 8, 16, 32)")
    ap.add_argument("--base", default="2,4", help="TPs to run guided at (the grid's presets)")
    ap.add_argument("--workloads", default="math,coding,swe,mix,web,doc,reason,shift,grpo")
    ap.add_argument("--modes", default="sync,async")
    ap.add_argument("--gpus", default="8")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--max-per-pair", type=int, default=6, help="per-role splits tried per (prefill TP, decode TP)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply trajectories per GPU")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "pd_role_tp.json"))
    ap.add_argument("--table", default="", help="also write the printed lines here")
    ap.add_argument("--render", default="", help="comma list of JSON files this script wrote: print and write "
                    "their cells together (--out, --table) without running anything")
    a = ap.parse_args()
    if a.model not in FAMILIES:
        ap.error(f"--model: one of {sorted(FAMILIES)}")
    tps, base = [int(t) for t in a.tps.split(",")], [int(t) for t in a.base.split(",") if t]
    if not set(base) <= set(tps):
        ap.error("--base must be among --tps")
    for t in tps:  # a size whose shard leaves no room for KV cannot serve
        try:
            room = FAMILIES[a.model][1](t).kv_capacity_tokens
        except ValueError as e:
            ap.error(f"--tps: {e}")
        if room <= 0:
            ap.error(f"--tps: {a.model} at {t} leaves no memory for the KV cache")
    say = Said()

    t0 = time.time()
    if a.render:
        runs = [json.loads(Path(f).read_text()) for f in a.render.split(",")]
        cells = [c for r in runs for c in r["cells"]]
        for c in cells:
            say(cell_line(c))
        report(cells, sum(r["wall_s"] for r in runs), say)
        parts = [x for r in runs for x in (r["parts"] if "parts" in r else [r["args"]])]  # a joined file's own
        out = {"parts": parts, "wall_s": sum(r["wall_s"] for r in runs), "cells": cells}
    else:
        cells = []
        for g in [int(x) for x in a.gpus.split(",")]:
            for w in a.workloads.split(","):
                for m in a.modes.split(","):
                    runs = [run_seed(a.model, w, m, g, int(s), tps, base, a.max_per_pair, a.scale)
                            for s in a.seeds.split(",")]
                    cells.append({"model": a.model, "workload": w, "mode": m, "gpus": g, "seeds": runs})
                    say(cell_line(cells[-1]))
        report(cells, time.time() - t0, say)
        out = {"args": vars(a), "wall_s": time.time() - t0, "cells": cells}
    save(a.out, out, a.table, say)


def report(cells: list[dict], wall: float, say) -> None:
    """A summary line per model and GPU count: what per-role TP adds to the best uniform layout."""
    say("")
    for model, g in dict.fromkeys((c["model"], c["gpus"]) for c in cells):
        cs = [c for c in cells if (c["model"], c["gpus"]) == (model, g) and c["seeds"][0]["per_role"]]
        gains = [median_ratio(c["seeds"], lambda r: r["best_uniform_s"], lambda r: r["best_per_role_s"])[0]
                 for c in cs]
        if not gains:
            continue
        wins = sum(x > 1.02 for x in gains)
        say(f"{model} at {g} GPUs, {len(cs)} cells: per-role over best uniform median {statistics.median(gains):.2f}x "
            f"({min(gains):.2f}-{max(gains):.2f}); per-role beats every uniform layout by > 2% in {wins}/{len(cs)}")
    say(f"seeds {sorted({r['seed'] for c in cells for r in c['seeds']})}; wall time {wall:.0f}s")

if __name__ == "__main__":
    main()
