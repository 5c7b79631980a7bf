"""Fit the step model (`hardware.GPU`) to the vLLM CPU engine's measured steps: the CPU preset.

    python -m benchmarks.sim.cpu_preset                       # fit data/cpu/steps-*.jsonl, write preset.json
    python -m benchmarks.sim.cpu_preset --check               # print the fit's errors only

The rows are `measure_cpu.py`'s (the `steps.jsonl` format of the GPU calibration, one file per
model); the fit is `calibrate.fit`, the GPU calibration's own least squares on log ratios, with
bounds wide enough for one CPU core (`CPU_FIT`: GFLOP/s and GB/s instead of TFLOP/s and TB/s;
a per-step `fixed_s` of up to 0.2 s, since an eager CPU engine pays Python and scheduling per
step where graph replays pay nothing). `sms` is the core count the engine was bound to
(attention's "waves" run on it). Each row's time is its fastest repetition (`ms_min`) by
default: the machine is shared, and the slowest repetitions measure the neighbours; for the
same reason the fit's loss is robust (`soft_l1`: a row off by far more than ~10% counts
about linearly, not squared), and every row records the load average it ran under.

`engine(model)` is the simulator's engine for that model on the fitted core: `ClusterCost.dense`
with vLLM's CPU settings (4,096 tokens a step, no chunking; 1 GiB of KV cache; prefix-cache
hits in whole 128-token blocks).

Non-goals: measuring (`measure_cpu.py`), contention between processes on the cores (the
preset is one engine alone on its core; `benchmarks/sim_fidelity.py` measures the difference).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
from functools import lru_cache
from pathlib import Path

from benchmarks.sim.calibrate import KINDS, Row, errors, fit, line, load
from benchmarks.sim.cost import ClusterCost
from benchmarks.sim.hardware import GPU
from benchmarks.sim.shape import CPU_MODELS

DATA = Path(__file__).parent / "data" / "cpu"
KV_CACHE_BYTES = 1 << 30  # VLLM_CPU_KVCACHE_SPACE=1 (vllm_local.serve_command)
STEP_TOKENS = 4096  # --max-num-batched-tokens, chunked prefill off (vllm_local.serve_command)
BLOCK_TOKENS = 128  # vLLM's CPU KV block: prefix-cache hits in whole blocks (docs/vllm_notes.md)

# field, unit, lower, upper (in that unit): calibrate.FIT's layout, scaled for one CPU core
CPU_FIT = (
    ("matmul_flops", 1e9, 1.0, 20_000.0),
    ("weight_bw", 1e9, 0.5, 1_000.0),
    ("kv_bw", 1e9, 0.05, 1_000.0),
    ("roofline_p", 1.0, 1.0, 20.0),
    ("gemm_s", 1e-6, 0.0, 5_000.0),
    ("attn_call_s", 1e-6, 0.0, 5_000.0),
    ("fixed_s", 1e-6, 0.0, 200_000.0),
    ("attn_causal_eff", 1.0, 0.001, 1.0),
    ("attn_prefix_eff", 1.0, 0.001, 1.0),
    ("decode_half_units", 1.0, 0.0, 1_000.0),
)
# a starting point of the right order for one modern core (AMX bf16); the fit moves it
START = GPU(name="cpu", matmul_flops=300e9, weight_bw=20e9, kv_bw=20e9, roofline_p=2.0, gemm_s=20e-6,
            attn_call_s=20e-6, fixed_s=2e-3, attn_causal_eff=0.3, attn_prefix_eff=0.3, decode_half_units=1.0,
            sms=1, attn_tile=128, prefix_rect=True, memory_bytes=float(KV_CACHE_BYTES))


def rows(models=tuple(CPU_MODELS), stat: str = "ms_min", data: Path = DATA) -> list[Row]:
    out = []
    for m in models:
        path = data / f"steps-{m}.jsonl"
        if path.exists():
            for r in load(path):
                r.ms = r.raw.get(stat, r.ms)
                out.append(r)
    return out


def fit_cpu(rs: list[Row], cores: int = 1) -> GPU:
    return fit(rs, START.with_params(sms=cores), tiles=(128,), rects=(True, False), bounds=CPU_FIT, loss="soft_l1")


def to_json(g: GPU) -> dict:
    return {f.name: getattr(g, f.name) for f in dataclasses.fields(g)}


@lru_cache(maxsize=8)
def preset(model: str | None = None, path: Path = DATA / "preset.json") -> GPU:
    """The fitted CPU core, as `cpu_preset` last wrote it: fitted to `model`'s rows alone when
    given (the eager engine's per-step costs do not carry across models well: see the README),
    else to every model's."""
    d = json.loads(path.read_text())
    g = d.get("per_model", {}).get(model) or d["gpu"]
    return GPU(**{f.name: g[f.name] for f in dataclasses.fields(GPU)})


def slowed(g: GPU, x: float) -> GPU:
    """The same core `x` times slower at everything (every time term ×x, every rate ÷x: the
    roofline is homogeneous, so each step takes exactly x times as long): an engine sharing its
    core with busy neighbours."""
    return g.with_params(matmul_flops=g.matmul_flops / x, weight_bw=g.weight_bw / x, kv_bw=g.kv_bw / x,
                         gemm_s=g.gemm_s * x, attn_call_s=g.attn_call_s * x, fixed_s=g.fixed_s * x,
                         name=f"{g.name}-x{x:.3g}")


def engine(model: str = "smollm2", gpu: GPU | None = None, **kw) -> ClusterCost:
    """One vLLM CPU engine serving `model`, as the simulator costs it."""
    shape = CPU_MODELS[model]
    kv = KV_CACHE_BYTES // shape.kv_bytes_per_token()
    return ClusterCost.dense(shape, 1, gpu=gpu or preset(model), prefill_chunk_tokens=STEP_TOKENS,
                             kv_capacity_tokens=kv, prefix_block_tokens=BLOCK_TOKENS, **kw)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(DATA), help="folder of steps-MODEL.jsonl (measure_cpu.py)")
    ap.add_argument("--stat", default="ms_min", choices=["ms_min", "ms"], help="a row's time: fastest or median rep")
    ap.add_argument("--check", action="store_true", help="print errors, write nothing")
    a = ap.parse_args(argv)
    data = Path(a.data)
    rs = rows(stat=a.stat, data=data)
    if not rs:
        ap.error(f"no steps-*.jsonl under {data}: run benchmarks.sim.measure_cpu first")
    infos = [json.loads(p.read_text()) for p in sorted(data.glob("info-*.json"))]
    cores = max((i.get("cores", 1) for i in infos), default=1)
    models = sorted({r.model for r in rs})
    print(f"{len(rs)} rows ({a.stat}), models: {', '.join(models)}; load during measurement "
          f"{min(r.raw.get('load', 0) for r in rs):.1f}-{max(r.raw.get('load', 0) for r in rs):.1f}")
    report = {}
    for m in models if len(models) > 1 else ():  # each model held out in turn: does the core's fit carry over?
        g = fit_cpu([r for r in rs if r.model != m], cores)
        held = errors([r for r in rs if r.model == m], g)
        print(line(f"held out: {m}", held))
        report[f"held_out_{m}"] = {k: {"median": v[0], "worst": v[1], "n": v[2]} for k, v in held.items()}
    g = fit_cpu(rs, cores).with_params(name="cpu", source=f"fitted {datetime.date.today()} to {data.name}/steps-*.jsonl "
                                                          f"({', '.join(models)}; {a.stat}) by benchmarks.sim.cpu_preset")
    for m in models:
        e = errors([r for r in rs if r.model == m], g)
        print(line(f"all rows, in-sample: {m}", e))
        report[f"in_sample_{m}"] = {k: {"median": v[0], "worst": v[1], "n": v[2]} for k, v in e.items()}
    per_model = {}
    for m in models:
        pm = fit_cpu([r for r in rs if r.model == m], cores)
        per_model[m] = pm.with_params(name=f"cpu-{m}", source=g.source.replace(f"({', '.join(models)};", f"({m};"))
        e = errors([r for r in rs if r.model == m], pm)
        print(line(f"{m} rows alone, in-sample", e))
        report[f"alone_{m}"] = {k: {"median": v[0], "worst": v[1], "n": v[2]} for k, v in e.items()}
    print(f"  {'':18s} {'all':>10s} " + " ".join(f"{m:>10s}" for m in models))
    for f, unit, _, _ in CPU_FIT:
        print(f"  {f:18s} {getattr(g, f) / unit:10.4g} " + " ".join(f"{getattr(per_model[m], f) / unit:10.4g}" for m in models)
              + f"  (x {unit:g})")
    if not a.check:
        out = {"gpu": to_json(g), "per_model": {m: to_json(pm) for m, pm in per_model.items()}, "stat": a.stat,
               "kinds": list(KINDS), "errors": report, "devices": infos}
        (data / "preset.json").write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {data / 'preset.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
