"""End-to-end rollout time under every prefill/decode allocation, in one seeded run.

For each model × workload × mode (sync, async) × cluster size, and each seed, the discrete-event
simulator (`benchmarks/sim`, driving the real `scheduler/` lifecycle, forecaster, capacity fit,
allocator and router) runs the same episodes under:

- colocated: every engine mixed, sticky least-loaded, at vLLM's default step budget (2,048);
- colocated, tuned: the best of chunk budgets 512 / 2,048 / 8,192 tokens a rank, in hindsight;
- every static split: p prefill + (N − p) decode engines, every p for N ≤ 8 engines, else
  p ∈ N·{1/8, 1/4, 3/8, 1/2, 5/8, 3/4};
- guided: every 5 s the forecaster and allocator may move engines; the allocator's step model
  is fitted to the simulated engines' own steps (no prior from the cost model). It starts from
  what it learned in the rollout phase before (the same workload with another seed, run first
  and not timed), in the roles that phase ended in: RL training rolls out the same environments
  step after step, and the live service keeps its forecasters, fit and engine roles between batches;
- guided, cold: the same without the phase before, colocated at the start (the first rollout
  phase of a run: the forecast is its prior until responses come back, the fit needs steps);
- guided, perfect forecast: warm as guided, told the true demand of the next 15 s;
- hindsight oracle: the best in hindsight of colocated, every static split, and a dynamic run
  told the true demand and the true cost model (`Policy.oracle()`).

Every policy pushes a split turn's response KV back to its prefill engine (no recompute) and
switches roles as the service does today (kv_both engines: routing only). `--restart-switch`
makes a switch a drain + 10 s of graph capture + a flushed prefix cache instead.

Prints one line per cell (medians over seeds, min–max in brackets), a summary per regime, and
writes the JSON, a text table and a plot (`--table`, `--plot`).

    python benchmarks/pd_allocation.py --quick          # one seed; dense at 8 GPUs, MoE at 32
    python benchmarks/pd_allocation.py                  # 3 seeds, the grid of docs/results/pd_allocation.txt
    python benchmarks/pd_allocation.py --models llama3-8b-tp1 --gpus 8 --modes sync --workloads swe --seeds 0
    python benchmarks/pd_allocation.py --render a.json,b.json --table t.txt --plot p.png   # runs done in parts
    python benchmarks/pd_allocation.py --trace batch.jsonl --trace-length-scale 20 --quick   # a recorded batch

`--render` joins its files: a cell (model, workload, mode, GPUs) that several files hold gets every
file's seeds, a later file's seed replacing an earlier one's, so a grid can run a seed or a model per
process. Each seed records the commit it ran at (`code`, `-dirty` with uncommitted changes).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from benchmarks.sim.cluster import Cluster, Policy, Result, Warm  # noqa: E402
from benchmarks.sim.cost import PRESETS, ClusterCost  # noqa: E402
from benchmarks.sim.workload import WORKLOADS, Workload  # noqa: E402
from scheduler.launch import splits  # noqa: E402

CHUNKS = (512, 2048, 8192)  # colocated step budgets tried (tokens a rank); 2,048 is vLLM's default
REGIME = {"llama3-8b-tp1": "dense 8B TP1", "qwen2.5-32b-tp2": "dense 32B TP2", "qwen2.5-32b-tp4": "dense 32B TP4",
          "qwen3-30b-a3b-dp8ep8": "MoE DP8-attention EP8", "qwen3-30b-a3b-dp16ep16": "MoE DP16-attention EP16",
          "qwen3-30b-a3b-dp32ep32": "MoE DP32-attention EP32", "legacy": "legacy"}


def code_version() -> str:
    """The commit this run's code is at, as `git describe` names it ("unknown" outside a checkout)."""
    try:
        p = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], cwd=Path(__file__).parent,
                           capture_output=True, text=True, timeout=30)
    except OSError:
        return "unknown"
    return p.stdout.strip() if p.returncode == 0 and p.stdout.strip() else "unknown"


def engine_workload(workload: str, cost: ClusterCost, scale: float = 1.0) -> Workload:
    """The workload with its trajectories per GPU counted per engine (an engine is `cost.gpus` GPUs)."""
    return dataclasses.replace(WORKLOADS[workload], per_gpu=max(1, round(WORKLOADS[workload].per_gpu * scale * cost.gpus)))


def phase_before(wl: Workload, engines: int, mode: str, seed: int, cost: ClusterCost) -> Warm:
    """The rollout phase before this one (same workload, another seed): what guided learned there."""
    before = Cluster(wl, engines, Policy.guided(), mode, seed=seed + 1000, cost=cost)
    before.run()
    return before.warm()


def run_seed(workload: str, mode: str, engines: int, seed: int, cost: ClusterCost, scale: float) -> dict:
    wl = engine_workload(workload, cost, scale)

    def one(policy: Policy, c: ClusterCost = cost, warm: Warm | None = None) -> Result:
        return Cluster(wl, engines, policy, mode, seed=seed, cost=c, warm=warm).run()

    warm = phase_before(wl, engines, mode, seed, cost)

    colo = one(Policy.colocated())
    tuned = {ch: colo if ch == cost.prefill_chunk_tokens else
             one(Policy.colocated(), dataclasses.replace(cost, prefill_chunk_tokens=ch)) for ch in CHUNKS}
    statics = [one(Policy.static(p)) for p in splits(engines)]
    best = min(statics, key=lambda r: r.makespan_s)
    guided, perfect = one(Policy.guided(), warm=warm), one(Policy.guided(perfect=True), warm=warm)
    cold, dyn = one(Policy.guided()), one(Policy.oracle())
    oracle = min([colo, dyn, *statics], key=lambda r: r.makespan_s)
    fe = guided.forecast
    return {
        "seed": seed, "trajectories": colo.trajectories, "turns": colo.turns,
        "colocated_s": colo.makespan_s,
        "colocated_tuned_s": min(r.makespan_s for r in tuned.values()),
        "colocated_tuned_chunk": min(tuned, key=lambda ch: tuned[ch].makespan_s),
        "statics": {r.policy: r.makespan_s for r in statics},
        "best_static": best.policy, "best_static_s": best.makespan_s,
        "guided_s": guided.makespan_s, "guided_moves": guided.moves, "guided_layouts": guided.layouts,
        "guided_cold_s": cold.makespan_s, "guided_cold_moves": cold.moves,
        "perfect_s": perfect.makespan_s, "perfect_moves": perfect.moves,
        "oracle_dynamic_s": dyn.makespan_s, "oracle_s": oracle.makespan_s, "oracle": oracle.policy,
        "prefill_tokens": {"colocated": colo.prefill_tokens, "best_static": best.prefill_tokens,
                           "guided": guided.prefill_tokens},
        "kv_pushed_tokens": {"best_static": best.pushed_tokens, "guided": guided.pushed_tokens},
        "steps": {"colocated": colo.steps, "best_static": best.steps, "guided": guided.steps},
        "forecast": None if fe is None else dataclasses.asdict(fe),
    }


class Said(list):
    """A benchmark's printed lines, kept for its table: `say = Said(); say("...")`, then `save(..., say)`."""

    def __call__(self, line: str) -> None:
        print(line, flush=True)
        self.append(line)


def save(out: str, payload: dict, table: str = "", lines: list[str] | None = None) -> None:
    """A benchmark's JSON at `out`, and its printed lines at `table` when one is named."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(payload, indent=1))
    if table:
        Path(table).write_text("\n".join(lines or []) + "\n")


def spread(xs: list[float]) -> dict:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    if not xs:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan")}
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def fmt(s: dict, pct: bool = False) -> str:
    if math.isnan(s["median"]):
        return "n/a"
    if pct:
        return f"{100 * s['median']:.0f}% [{100 * s['min']:.0f}-{100 * s['max']:.0f}]"
    return f"{s['median']:.2f}x [{s['min']:.2f}-{s['max']:.2f}]"


def summarize(cell: dict) -> dict:
    runs = cell["seeds"]
    ratio = {k: spread([r[f] / r["guided_s"] for r in runs]) for k, f in
             (("guided/colocated", "colocated_s"), ("guided/colocated-tuned", "colocated_tuned_s"),
              ("guided/best-static", "best_static_s"), ("guided/oracle", "oracle_s"),
              ("best-static/colocated", None), ("perfect/colocated", None), ("oracle/colocated", None)) if f}
    ratio["best-static/colocated"] = spread([r["colocated_s"] / r["best_static_s"] for r in runs])
    ratio["perfect/colocated"] = spread([r["colocated_s"] / r["perfect_s"] for r in runs])
    ratio["cold/colocated"] = spread([r["colocated_s"] / r["guided_cold_s"] for r in runs if "guided_cold_s" in r])
    ratio["oracle/colocated"] = spread([r["colocated_s"] / r["oracle_s"] for r in runs])
    ratio["prefill WAPE"] = spread([(r["forecast"] or {}).get("prefill_wape", float("nan")) for r in runs])
    ratio["decode WAPE"] = spread([(r["forecast"] or {}).get("decode_wape", float("nan")) for r in runs])
    ratio["guided moves"] = spread([r["guided_moves"] for r in runs])
    return ratio


def geomean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="llama3-8b-tp1,qwen2.5-32b-tp4,qwen3-30b-a3b-dp8ep8",
                    help=f"comma list of {sorted(PRESETS)}")
    ap.add_argument("--workloads", default="math,coding,swe,mix,web,doc,reason,shift,grpo")
    ap.add_argument("--modes", default="sync,async")
    ap.add_argument("--gpus", default="8,32,128", help="per model, sizes with fewer than 2 engines are skipped")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--quick", action="store_true", help="one seed; dense models at 8 GPUs, the MoE at 32")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply trajectories per GPU")
    ap.add_argument("--restart-switch", action="store_true",
                    help="a role switch drains, takes 10 s (graph capture) and flushes the prefix cache")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "pd_allocation.json"))
    ap.add_argument("--table", default="", help="also write the printed table here")
    ap.add_argument("--plot", default="", help="write a plot of speedup by regime here (matplotlib)")
    ap.add_argument("--render", default="", help="comma list of JSON files this script wrote: print their "
                    "cells and summary together (and --table, --plot, --out) without running anything")
    ap.add_argument("--trace", default="", help="a recording (`rollout export`) as the one workload, instead of the "
                    "synthetic ones (benchmarks/sim/trace.py)")
    ap.add_argument("--trace-time-scale", type=float, default=1.0, help="--trace: multiply recorded tool times")
    ap.add_argument("--trace-length-scale", type=float, default=1.0, help="--trace: multiply recorded token counts")
    args = ap.parse_args()
    if args.trace:
        from benchmarks.sim.trace import trace_workload

        WORKLOADS["trace"] = trace_workload(Path(args.trace), time_scale=args.trace_time_scale,
                                            length_scale=args.trace_length_scale)
        args.workloads = "trace"
    if args.render:
        render(args)
        return
    code = code_version()
    costs = {m: PRESETS[m]() for m in args.models.split(",")}
    if args.restart_switch:
        costs = {m: c.restart_switch() for m, c in costs.items()}
    seeds = [0] if args.quick else [int(s) for s in args.seeds.split(",")]
    say = Said()

    cells, t0 = [], time.perf_counter()
    for (model, cost), workload, mode in itertools.product(costs.items(), args.workloads.split(","),
                                                          args.modes.split(",")):
        sizes = [int(g) for g in args.gpus.split(",")]
        if args.quick:
            sizes = [max(8, 2 * cost.gpus)] if cost.dp > 1 else [8]
        for gpus in sizes:
            engines = gpus // cost.gpus
            if engines < 2:
                continue
            runs = [{**run_seed(workload, mode, engines, s, cost, args.scale), "code": code} for s in seeds]
            cell = {"model": model, "regime": REGIME.get(model, model), "workload": workload, "mode": mode,
                    "gpus": gpus, "engines": engines, "seeds": runs}
            cell["summary"], cell["code"] = summarize(cell), code
            cells.append(cell)
            say(line(cell))
    wall = time.perf_counter() - t0
    report(cells, seeds, wall, say)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": _args(args), "cost": {m: c.describe() for m, c in costs.items()},
                               "wall_s": wall, "cells": cells}, indent=1))
    if args.table:
        Path(args.table).write_text("\n".join(say) + "\n")
    if args.plot:
        plot(cells, args.plot)


def _args(args: argparse.Namespace | dict) -> dict:
    """What the JSON records of a run's arguments: not where its files went (machine paths)."""
    d = args if isinstance(args, dict) else vars(args)
    return {k: v for k, v in d.items() if k not in ("out", "table", "plot", "render")}


def line(cell: dict) -> str:
    s, runs = cell["summary"], cell["seeds"]
    names = [r["best_static"] for r in runs]
    best = max(names, key=names.count)  # the most frequent; a tie: the lowest seed's (a set's order varies by run)
    return (f"{cell['model']} {cell['workload']:6s} {cell['mode']:5s} {cell['gpus']:3d} GPUs "
            f"({runs[0]['trajectories']:5d} traj): "
            f"guided/colocated {fmt(s['guided/colocated'])}  /best-static {fmt(s['guided/best-static'])} "
            f"({best})  /oracle {fmt(s['guided/oracle'])}  "
            f"best-static/colocated {fmt(s['best-static/colocated'])}  "
            f"perfect-forecast/colocated {fmt(s['perfect/colocated'])}  "
            f"cold/colocated {fmt(s['cold/colocated']) if 'cold/colocated' in s else 'n/a'}  "
            f"tuned-colocated/colocated {fmt(spread([r['colocated_s'] / r['colocated_tuned_s'] for r in runs]))}  "
            f"moves {s['guided moves']['median']:.0f}  WAPE prefill {fmt(s['prefill WAPE'], True)} "
            f"decode {fmt(s['decode WAPE'], True)}")


def join(runs: list[dict]) -> list[dict]:
    """The cells of several runs, one per (model, workload, mode, GPUs), each with every run's seeds
    (a later run's seed replaces an earlier one's): by model as they first appear, then by size,
    then in the order they first appear."""
    cells: dict[tuple, dict] = {}
    for run in runs:
        for c in run["cells"]:
            seeds = [{**r, "code": r.get("code", c.get("code", "unknown"))} for r in c["seeds"]]
            key = (c["model"], c["workload"], c["mode"], c["gpus"])
            had = {r["seed"]: r for r in cells[key]["seeds"]} if key in cells else {}
            had.update((r["seed"], r) for r in seeds)
            cells.setdefault(key, c)["seeds"] = [had[k] for k in sorted(had)]
    for c in cells.values():
        c["summary"] = summarize(c)
        c["code"] = "+".join(dict.fromkeys(r["code"] for r in c["seeds"]))
    models = list(dict.fromkeys(c["model"] for c in cells.values()))
    return sorted(cells.values(), key=lambda c: (models.index(c["model"]), c["gpus"]))


def render(args: argparse.Namespace) -> None:
    runs = [json.loads(Path(f).read_text()) for f in args.render.split(",")]
    cells = join(runs)
    say = Said()

    for c in cells:
        say(line(c))
    seeds = sorted({r["seed"] for c in cells for r in c["seeds"]})
    report(cells, seeds, sum(r["wall_s"] for r in runs), say)
    if args.out:
        parts = [p for r in runs for p in (r["parts"] if "parts" in r else [_args(r["args"])])]  # a joined file's own
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"parts": parts,
                                              "cost": {k: v for r in runs for k, v in r["cost"].items()},
                                              "wall_s": sum(r["wall_s"] for r in runs), "cells": cells}, indent=1))
    if args.table:
        Path(args.table).write_text("\n".join(say) + "\n")
    if args.plot:
        plot(cells, args.plot)


def report(cells: list[dict], seeds: list[int], wall: float, say) -> None:
    say("")
    say("per regime (medians of the per-cell medians; range over cells):")
    for regime in dict.fromkeys(c["regime"] for c in cells):
        cs = [c for c in cells if c["regime"] == regime]

        def col(key: str, cs: list[dict] = cs) -> str:
            xs = [c["summary"][key]["median"] for c in cs]
            return f"{statistics.median(xs):.2f}x ({min(xs):.2f}-{max(xs):.2f})"

        vs_best = [c["summary"]["guided/best-static"]["median"] for c in cs]
        say(f"{regime:24s} cells {len(cs):3d}  guided/colocated {col('guided/colocated')}  "
            f"guided/best-static {col('guided/best-static')}, >= 0.98x in {sum(x >= 0.98 for x in vs_best)}/{len(cs)}  "
            f"guided/oracle {col('guided/oracle')}  best-static/colocated {col('best-static/colocated')}  "
            f"cold/colocated {col('cold/colocated') if all('cold/colocated' in c['summary'] for c in cs) else 'n/a'}  "
            f"oracle/colocated {col('oracle/colocated')}")
    xs = [c["summary"]["guided/colocated"]["median"] for c in cells]
    vs_best = [c["summary"]["guided/best-static"]["median"] for c in cells]
    vs_oracle = [c["summary"]["guided/oracle"]["median"] for c in cells]
    near = sum(x >= 0.98 for x in vs_best)
    say(f"all {len(cells)} cells: guided/colocated {min(xs):.2f}-{max(xs):.2f}x (geomean {geomean(xs):.2f}x); "
        f"guided >= 0.98x of the best split in {near}/{len(cells)} ({100 * near / len(cells):.0f}%); guided/oracle "
        f"{statistics.median(vs_oracle):.2f}x in median; published reference for this design: 1.11-4.05x over "
        f"colocation")
    say(f"seeds {seeds}; wall time {wall:.0f}s")


def plot(cells: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    regimes = list(dict.fromkeys(c["regime"] for c in cells))
    keys = (("best-static/colocated", "best static split"), ("oracle/colocated", "hindsight oracle"),
            ("guided/colocated", "guided (our forecast)"), ("perfect/colocated", "guided (perfect forecast)"))
    fig, ax = plt.subplots(figsize=(max(9.0, 2.0 * len(regimes)), 4.5))
    width = 0.8 / len(keys)
    for i, (key, label) in enumerate(keys):
        for j, regime in enumerate(regimes):
            ys = [c["summary"][key]["median"] for c in cells if c["regime"] == regime]
            x = j + (i - (len(keys) - 1) / 2) * width
            ax.scatter([x] * len(ys), ys, s=10, color=f"C{i}", alpha=0.6, label=label if j == 0 else None)
            ax.plot([x - width / 2, x + width / 2], [statistics.median(ys)] * 2, color=f"C{i}", lw=2)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(regimes)), [r.replace(" ", "\n", 1) for r in regimes])  # two lines: names fit
    ax.set_ylabel("speedup over colocated (end-to-end rollout time)")
    ax.set_title("PD allocation by regime: one dot per cell (median of seeds), bar = median of cells")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
