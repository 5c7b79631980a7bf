"""Does the simulator reproduce a real rollout run? A real batch on vLLM CPU engines, the same
workload simulated with the CPU preset, one line per figure.

    python benchmarks/sim_fidelity.py                      # tiny model, 64 episodes, 4 runs (~5 min on a quiet machine)
    python benchmarks/sim_fidelity.py --resimulate         # the simulations again, from the recordings

For each configuration (`--configs ENGINESxCONCURRENCY,...`, default 2 engines and 1, 16
trajectories in flight): `rollout up` (gateway, Redis queue, worker, env worker) in front of
the first ENGINES of the vLLM CPU servers this script starts (one core each: `--cpus`), a batch
of `calc` episodes, its recording (`rollout export`'s format), and the simulation of that
recording (`benchmarks/sim/fidelity.py`: the real scheduler classes, engines costed by the
CPU preset `benchmarks/sim/data/cpu/preset.json`). Prints

    fidelity CONFIG/SIM NAME real=X sim=Y error=Z%

for makespan, p50/p90 trajectory latency, mean per-turn prefill and decode time and engine
busy fraction, the median of `--runs` runs, for four simulations: `engine` (the engine-only
simulation), `service` (plus the two per-turn overhead terms of `fidelity.Overhead`, read off
the same recording), `loaded` (plus the engine slowed by the contention measured in the run,
`fidelity.contention`, and the engines spread apart by the speeds measured in it,
`fidelity.engine_spread`; its engine time per turn, prefill + decode, is fitted, the other
figures are not) and `per-turn` (the same, with each turn's own recorded overheads instead of
their means); from the second run on, `carried` predicts a run from the one before it (its
contention, spread and overhead means, this run's workload): nothing in it is read off the run
it is compared with, so with `--runs 4` the first run calibrates and three are predicted. Every
run notes the load average before and after; the JSON (`--out`) has every run's figures,
recording paths, loads and the engines' sampled `/metrics`. Results and their reading:
`benchmarks/sim/README.md`.

Non-goals: GPUs, prefill/decode disaggregation (every engine is mixed), failures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import threading
import time
from pathlib import Path

import httpx

from benchmarks.sim import cpu_preset
from benchmarks.sim.fidelity import (Figures, Line, Overhead, Runs, contention, engine_spread, real_figures,
                                     recorded_workload, request_delays, simulate)
from rollout_service.local import vllm_local
from rollout_service.recording import read, write
from trainer_client import RolloutClient

sys.path.insert(0, str(Path(__file__).parent))
from _up import start_up  # noqa: E402

_GAUGE = re.compile(r"^vllm:num_requests_(running|waiting)\{[^}]*\}\s+([0-9.eE+-]+)", re.M)
_COUNTER = re.compile(r"^vllm:(prompt|generation)_tokens_total\{[^}]*\}\s+([0-9.eE+-]+)", re.M)


class BusyProbe:
    """Samples each engine's /metrics every `period_s`: (seconds since start, requests running,
    waiting, prompt tokens and generated tokens so far). Busy: a request runs or waits. Not
    faster: rendering /metrics costs the engine's API server CPU time on the shared cores."""

    def __init__(self, urls: list[str], period_s: float = 0.5):
        self.urls, self.period_s = urls, period_s
        self.samples: dict[str, list[tuple[float, float, float, float, float]]] = {u: [] for u in urls}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        t0 = time.monotonic()
        with httpx.Client(timeout=5) as http:
            while not self._stop.is_set():
                for u in self.urls:
                    try:
                        text = http.get(f"{u}/metrics").text
                    except httpx.HTTPError:
                        continue
                    g = dict.fromkeys(("running", "waiting", "prompt", "generation"), 0.0)
                    for k, v in (*_GAUGE.findall(text), *_COUNTER.findall(text)):
                        g[k] += float(v)
                    self.samples[u].append((round(time.monotonic() - t0, 3), g["running"], g["waiting"],
                                            g["prompt"], g["generation"]))
                self._stop.wait(self.period_s)

    def __enter__(self) -> BusyProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def fraction(self) -> float:
        per = [sum(r + w > 0 for _, r, w, _, _ in s) / len(s) for s in self.samples.values() if s]
        return sum(per) / len(per) if per else 0.0

    def series(self) -> list[list[tuple[float, float, float, float, float]]]:
        """Each engine's samples, in the order of `urls`."""
        return [self.samples[u] for u in self.urls]


def load() -> float:
    return round(os.getloadavg()[0], 2)


def run_batch(gateway: str, engine_urls: list[str], trajectories: int, turns: int, max_tokens: int,
              recording: Path, seed: int = 0) -> tuple[list, float, BusyProbe]:
    """One batch of `calc` episodes through the service; its recording is written to `recording`.
    Returns (trajectories, makespan in s, the engines' metrics sampled through the batch)."""
    tasks = [{"seed": seed * 100_000 + i} for i in range(trajectories)]
    with RolloutClient(gateway, timeout=120) as c, BusyProbe(engine_urls) as probe:
        b = c.submit(tasks, env="calc", sampling={"temperature": 1.0, "max_tokens": max_tokens, "seed": seed},
                     max_turns=turns)
        for _ in c.iter_results(b.id):
            pass
        st = c.wait(b.id, poll_s=0.2)
    with RolloutClient(gateway, timeout=120) as c:
        trajs = list(c.trajectories(b.id))
        tmp = recording.with_name(recording.name + ".part")
        with tmp.open("w") as f:
            write(f, st, c.request(b.id), trajs)
        tmp.replace(recording)
    failed = [t for t in trajs if t.failure is not None]
    if failed:
        raise RuntimeError(f"{len(failed)} trajectories failed, e.g. {failed[0].failure}")
    return trajs, st.finished_at - st.created_at, probe


def start_service(redis_url: str, engines: list[str], model: str, tokenizer: str, concurrency: int):
    """`rollout up` on the first engine; the others registered through the admin API."""
    up, gw = start_up(redis_url, "--engine-url", engines[0], "--model", model, "--tokenizer", tokenizer,
                      env={"ROLLOUT_WORKER_CONCURRENCY": str(concurrency)})
    with RolloutClient(gw) as c:
        for i, url in enumerate(engines[1:], 1):
            c.register_engine(f"engine-{i}", url, model=model, tokenizer=tokenizer)
    time.sleep(3)  # the worker's fleet reads the registry every 2 s
    return up, gw


SIMS = ("engine", "service", "loaded", "per-turn")
CONTENTION_ROUNDS = 3  # fixed-point rounds matching the loaded simulation's engine time per turn to the run's


def slowed_engine(model: str, x: float):
    """The preset's engine for `model`, `x` times slower (contention)."""
    return cpu_preset.engine(model, gpu=cpu_preset.slowed(cpu_preset.preset(model), x))


def simulate_run(recording: Path, model: str, engines: int, concurrency: int, real: Figures) -> dict:
    """Four simulations of one recorded run: `engine` (the preset, engines only), `service`
    (plus the mean per-turn overhead terms read off the recording), `loaded` (plus the preset
    slowed by the run's measured contention, the engines spread apart as measured), `per-turn`
    (`loaded` with each turn's own recorded overheads); with the overhead, contention and spread used."""
    _, records = read(recording)
    trajs = [r.trajectory for r in records]
    over = Overhead.from_recording(trajs, f"means of {recording.name}")
    spread = engine_spread(trajs)
    cost = cpu_preset.engine(model)
    engine_only = simulate(recorded_workload(recording, concurrency, engines), engines, cost)
    wl = recorded_workload(recording, concurrency, engines, over)
    x, loaded = contention(real, engine_only), None
    for _ in range(CONTENTION_ROUNDS):  # slower steps change the batches, and the batch the step time
        loaded = simulate(wl, engines, slowed_engine(model, x), over, spread=spread)
        x = max(x * real.engine_s / loaded.engine_s, 1.0)
    slow = slowed_engine(model, x)
    per_turn = recorded_workload(recording, concurrency, engines, per_turn=True)
    return {"engine": engine_only, "service": simulate(wl, engines, cost, over),
            "loaded": simulate(wl, engines, slow, over, spread=spread),
            "per-turn": simulate(per_turn, engines, slow, delays=request_delays(recording), spread=spread),
            "overhead": over, "contention": x, "spread": spread}


def fidelity_run(gateway: str, engine_urls: list[str], model: str, concurrency: int, trajectories: int,
                 turns: int, max_tokens: int, recording: Path, seed: int) -> dict:
    """A real batch and its two simulations: {"real", "engine", "service"} Figures, overhead, loads."""
    before = load()
    trajs, makespan, probe = run_batch(gateway, engine_urls, trajectories, turns, max_tokens, recording, seed)
    after = load()
    real = real_figures(trajs, makespan, probe.fraction())
    return {"real": real, **simulate_run(recording, model, len(engine_urls), concurrency, real),
            "load_before": before, "load_after": after, "recording": str(recording)}


def report(results: dict) -> None:
    """Simulate every recorded run of `results` again (with the preset as it is now), print the
    median lines of each configuration, and fill `results` in."""
    results["preset"] = cpu_preset.preset().source
    for name, cfg in results["configs"].items():
        if not cfg["runs"]:
            continue
        by = {label: Runs() for label in SIMS}
        carried, prev = Runs(), None
        for run in cfg["runs"]:
            real = Figures(**run["real"])
            rec, model, n = Path(run["recording"]), results["model"], cfg["engines"]
            sims = simulate_run(rec, model, n, cfg["concurrency"], real)
            for label, rs in by.items():
                rs.real.append(real)
                rs.sim.append(sims[label])
                run[label] = sims[label].row()
            run["overhead"] = dataclasses.asdict(sims["overhead"])
            run["contention"] = round(sims["contention"], 3)
            run["spread"] = round(sims["spread"], 3)
            if prev is not None:  # a prediction: the previous run's contention, spread, overheads; this run's workload
                x, spread, over = prev
                slow = slowed_engine(model, x)
                sim = simulate(recorded_workload(rec, cfg["concurrency"], n, over), n, slow, over, spread=spread)
                carried.real.append(real)
                carried.sim.append(sim)
                run["carried"] = sim.row()
            prev = (sims["contention"], sims["spread"], sims["overhead"])
        if carried.real:
            by["carried"] = carried
        loads = [x for run in cfg["runs"] for x in (run["load_before"], run["load_after"])]
        cfg["load_range"] = [min(loads), max(loads)]
        cfg["median"] = {label: [_line(ln) for ln in rs.lines()] for label, rs in by.items()}
        for label, rs in by.items():
            for ln in rs.lines():
                print(f"{ln.text(f'{name}/{label} ')} (median of {len(rs.real)}; load {min(loads):.1f}-{max(loads):.1f})")
        xs = sorted(run["contention"] for run in cfg["runs"])
        print(f"fidelity {name} contention x{xs[len(xs) // 2]:.2f} (runs: {', '.join(f'{x:.2f}' for x in xs)})")


def real_runs(a, results: dict, out: Path) -> None:
    """Start the engines, and per configuration `rollout up` and `a.runs` batches; each run's real
    figures and recording go into `results` (written to `out` after every run)."""
    configs = [tuple(int(x) for x in c.split("x")) for c in a.configs.split(",")]
    cores = a.cpus.split(",")
    n_engines = max(e for e, _ in configs)
    if n_engines > len(cores):
        raise SystemExit(f"{n_engines} engines but only cores {a.cpus}")
    path = vllm_local.prepare_model(a.model)
    base = 18600 + os.getpid() % 200
    procs = [vllm_local.start_server(path, base + i, a.model, cpus=cores[i]) for i in range(n_engines)]
    urls = [f"http://127.0.0.1:{base + i}" for i in range(n_engines)]
    rec_dir = out.with_suffix("")
    rec_dir.mkdir(parents=True, exist_ok=True)
    try:
        for p, u in zip(procs, urls):
            vllm_local.wait_ready(u, 600, p)
        for engines, conc in configs:
            name = f"{engines}e-c{conc}"
            cfg = results["configs"][name] = {"engines": engines, "concurrency": conc, "runs": []}
            up, gw = start_service(a.redis_url, urls[:engines], a.model, str(path), conc)
            try:
                run_batch(gw, urls[:engines], 2 * engines, 1, 8, rec_dir / f"{name}-warmup.jsonl")  # first calls' costs
                for r in range(a.runs):
                    recording = rec_dir / f"{name}-run{r}.jsonl"
                    before = load()
                    trajs, makespan, probe = run_batch(gw, urls[:engines], a.trajectories, a.turns, a.max_tokens,
                                                       recording, seed=r + 1)
                    cfg["runs"].append({"real": real_figures(trajs, makespan, probe.fraction()).row(),
                                        "load_before": before, "load_after": load(), "recording": str(recording),
                                        "engine_metrics": probe.series()})
                    out.write_text(json.dumps(results, indent=1) + "\n")
                    print(f"run {r} {name}: makespan {makespan:.1f} s, load {before} -> {load()}", file=sys.stderr)
            finally:
                up.terminate()
                up.wait(30)
    finally:
        for p in procs:
            vllm_local.stop_server(p)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", choices=["smollm2", "tiny"])
    ap.add_argument("--configs", default="2x16,1x16", help="ENGINESxCONCURRENCY, comma separated")
    ap.add_argument("--trajectories", type=int, default=64)
    ap.add_argument("--turns", type=int, default=3, help="max_turns of each calc episode")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--runs", type=int, default=4, help="per configuration; the first calibrates `carried`")
    ap.add_argument("--cpus", default="0,1", help="one core per engine, in order")
    ap.add_argument("--redis-url", default=os.environ.get("ROLLOUT_REDIS_URL", "redis://127.0.0.1:6379/0"))
    ap.add_argument("--out", default="benchmarks/results/sim_fidelity_tiny.json")
    ap.add_argument("--resimulate", action="store_true",
                    help="no real runs: simulate the recordings of --out again (e.g. after refitting the preset)")
    a = ap.parse_args()
    out = Path(a.out)
    if a.resimulate:
        results = json.loads(out.read_text())
    else:
        results = {"model": a.model, "trajectories": a.trajectories, "turns": a.turns, "max_tokens": a.max_tokens,
                   "cpus": a.cpus, "configs": {}}
        out.parent.mkdir(parents=True, exist_ok=True)
        real_runs(a, results, out)
    report(results)
    out.write_text(json.dumps(results, indent=1) + "\n")


def _line(ln: Line) -> dict:
    return {"name": ln.name, "real": round(ln.real, 4), "sim": round(ln.sim, 4), "error_pct": round(ln.error_pct, 1)}


if __name__ == "__main__":
    main()
