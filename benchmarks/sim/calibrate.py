"""Fit a GPU's figures (`hardware.GPU`) to measured engine steps, and predict new ones.

    python -m benchmarks.sim.calibrate benchmarks/sim/data/h200/steps.jsonl
    python -m benchmarks.sim.calibrate --predict new_steps.jsonl [--preset h200] > with_pred.jsonl

Fitting minimises the squared log ratio predicted/measured over every row (so each row's
relative error counts alike), with scipy's bounded least squares. The attention tile and the
prefixed-mask flag are discrete: each combination is fitted and the best in-sample kept. It
prints, per kind (decode, prefill, mixed), the median and worst relative error:
- in-sample and held out, for a fit that never saw one model shape (`--hold-model`) and a
  random fifth of the remaining mixed rows (`--seed`);
- in-sample for the fit on every row, which it then prints as a `GPU(...)` preset to paste into
  `hardware.py` (with the date and the data file it came from).
`--loo` adds the held-out errors with each model shape left out in turn.

`--predict FILE` reads lines in the steps.jsonl format (`ms` optional; missing B, C, k, P are 0)
and writes each back as JSON with `ms_pred` added; any shape works, fitted or not.

Non-goals: fitting communication (one GPU measures none), uncertainty intervals.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import random
import sys
from pathlib import Path
from statistics import median

import numpy as np
from scipy.optimize import least_squares

from benchmarks.sim.hardware import GPU, PRESETS
from benchmarks.sim.shape import FIELDS, Shape

KINDS = ("decode", "prefill", "mixed")
# field, unit it is optimised in, lower and upper bound (in that unit)
FIT = (
    ("matmul_flops", 1e12, 10.0, 5000.0),
    ("weight_bw", 1e12, 0.1, 20.0),
    ("kv_bw", 1e12, 0.1, 20.0),
    ("roofline_p", 1.0, 1.0, 20.0),
    ("gemm_s", 1e-6, 0.0, 200.0),
    ("attn_call_s", 1e-6, 0.0, 200.0),
    ("fixed_s", 1e-6, 0.0, 5000.0),
    ("attn_causal_eff", 1.0, 0.02, 1.0),
    ("attn_prefix_eff", 1.0, 0.02, 1.0),
    ("decode_half_units", 1.0, 0.0, 100.0),
)
TILES = (64, 128, 256)
DEFAULT_HOLD = "qwen2.5-32b-tp4"


@dataclasses.dataclass(slots=True)
class Row:
    shape: Shape
    kind: str
    B: int
    C: int
    k: int
    P: int
    ms: float | None
    model: str
    raw: dict

    @staticmethod
    def parse(d: dict) -> Row:
        kind = d.get("kind") or ("mixed" if d.get("B") and d.get("k") else "prefill" if d.get("k") else "decode")
        model = d.get("model") or "/".join(str(d[f]) for f in FIELDS)
        return Row(Shape.from_row(d), kind, int(d.get("B", 0)), int(d.get("C", 0)), int(d.get("k", 0)),
                   int(d.get("P", 0)), d.get("ms"), model, d)

    def predict_ms(self, gpu: GPU) -> float:
        return gpu.step_s(self.shape, self.B, self.C, self.k, self.P) * 1e3


def load(path: str | Path) -> list[Row]:
    rows = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            d = json.loads(line)
            if "error" not in d and all(f in d for f in FIELDS):
                rows.append(Row.parse(d))
    return rows


def device_info(path: Path) -> dict:
    """The first line of an info.jsonl that names a device, or {}."""
    if path.exists():
        for line in path.read_text().splitlines():
            d = json.loads(line) if line.strip() else {}
            if "device" in d:
                return d
    return {}


def fit(rows: list[Row], base: GPU, tiles=TILES, rects=(True, False), bounds=FIT, loss: str = "linear") -> GPU:
    """The GPU that best explains `rows` (all with `ms`), starting from `base`; `bounds` has
    FIT's layout (a CPU's figures lie far below a GPU's: `cpu_preset.CPU_FIT`). `loss`:
    scipy's; "soft_l1" (scale 0.1 in log units, ~10%) lets a row a busy neighbour slowed
    weigh less (`cpu_preset`)."""
    y = np.log([r.ms for r in rows])
    best, best_cost = base, float("inf")
    for tile in tiles:
        for rect in rects:
            start = base.with_params(attn_tile=tile, prefix_rect=rect)

            def gpu_at(x: np.ndarray, start=start) -> GPU:
                return start.with_params(**{f: v * unit for (f, unit, _, _), v in zip(bounds, x)})

            def residuals(x: np.ndarray) -> np.ndarray:
                g = gpu_at(x)
                return np.log([r.predict_ms(g) for r in rows]) - y

            x0 = [min(max(getattr(start, f) / unit, lo), hi) for f, unit, lo, hi in bounds]
            sol = least_squares(residuals, x0, bounds=([lo for *_, lo, _ in bounds], [hi for *_, hi in bounds]),
                                loss=loss, f_scale=0.1)
            if sol.cost < best_cost:
                best, best_cost = gpu_at(sol.x), sol.cost
    return best


def errors(rows: list[Row], gpu: GPU) -> dict[str, tuple[float, float, int]]:
    """kind -> (median, worst) absolute relative error, and the row count."""
    out = {}
    for kind in KINDS:
        e = [abs(r.predict_ms(gpu) / r.ms - 1) for r in rows if r.kind == kind]
        if e:
            out[kind] = (median(e), max(e), len(e))
    return out


def split(rows: list[Row], hold_model: str, seed: int) -> tuple[list[Row], list[Row]]:
    """Held out: every row of `hold_model`, and a random fifth of the other mixed rows."""
    mixed = [i for i, r in enumerate(rows) if r.kind == "mixed" and r.model != hold_model]
    held = set(random.Random(seed).sample(mixed, len(mixed) // 5))
    held |= {i for i, r in enumerate(rows) if r.model == hold_model}
    return [r for i, r in enumerate(rows) if i not in held], [r for i, r in enumerate(rows) if i in held]


def line(label: str, errs: dict) -> str:
    return f"{label:34s}" + "  ".join(f"{k} {100 * m:4.1f}% / {100 * w:5.1f}% (n={n})" for k, (m, w, n) in errs.items())


def preset_text(g: GPU, data: str) -> str:
    today = datetime.date.today().isoformat()
    vals = {f.name: getattr(g, f.name) for f in dataclasses.fields(g) if f.name != "source"}
    body = "\n".join(f"    {k}={v!r}," if not isinstance(v, float) else f"    {k}={v:.4g}," for k, v in vals.items())
    return f"# Fitted by `python -m benchmarks.sim.calibrate {data}` on {today}\n{g.name.upper()} = GPU(\n{body}\n" \
           f"    source=\"fitted {today} to {data}\",\n)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("steps", nargs="?", help="steps.jsonl to fit")
    ap.add_argument("--predict", metavar="FILE", help="add ms_pred to each line of FILE ('-': stdin)")
    ap.add_argument("--preset", default="h200", choices=sorted(PRESETS), help="GPU figures for --predict")
    ap.add_argument("--name", default="h200", help="name of the fitted preset")
    ap.add_argument("--sms", type=int, default=None, help="SM count of the measured GPU (default: info.jsonl, else the h200's)")
    ap.add_argument("--memory-gb", type=float, default=None, help="GPU memory (default: info.jsonl, else the h200's)")
    ap.add_argument("--hold-model", default=None, help=f"model shape held out (default {DEFAULT_HOLD} if present)")
    ap.add_argument("--seed", type=int, default=0, help="draws the held-out fifth of the mixed rows")
    ap.add_argument("--fits-only", action="store_true", help="drop rows flagged as not fitting in GPU memory")
    ap.add_argument("--loo", action="store_true", help="also hold out each model shape in turn")
    args = ap.parse_args(argv)

    if args.predict:
        gpu = PRESETS[args.preset]
        text = sys.stdin.read() if args.predict == "-" else Path(args.predict).read_text()
        for raw in text.splitlines():
            if raw.strip():
                d = json.loads(raw)
                d["ms_pred"] = round(Row.parse(d).predict_ms(gpu), 4)
                print(json.dumps(d))
        return 0
    if not args.steps:
        ap.error("give a steps.jsonl to fit, or --predict FILE")

    rows = [r for r in load(args.steps) if r.ms and (not args.fits_only or r.raw.get("fits", r.raw.get("fits_h200", True)))]
    base = PRESETS["h200"].with_params(name=args.name)
    device = device_info(Path(args.steps).with_name("info.jsonl"))  # measure.py writes the SM count there
    sms, memory_gb = args.sms or device.get("sms"), args.memory_gb or device.get("memory_gb")
    if sms:
        base = base.with_params(sms=int(sms))
    if memory_gb:
        base = base.with_params(memory_bytes=float(memory_gb) * 1e9)
    models = sorted({r.model for r in rows})
    hold = args.hold_model or (DEFAULT_HOLD if DEFAULT_HOLD in models else models[-1])
    print(f"{len(rows)} rows, models: {', '.join(models)}")
    print("relative error per kind: median / worst")

    train, held = split(rows, hold, args.seed)
    g = fit(train, base)
    print(line(f"fit without {hold} + 1/5 mixed:", {}))
    print(line("  in-sample", errors(train, g)))
    print(line("  held out", errors(held, g)))
    if args.loo:
        for m in models:
            tr, te = [r for r in rows if r.model != m], [r for r in rows if r.model == m]
            print(line(f"  held out: {m}", errors(te, fit(tr, base))))
    g = fit(rows, base)
    print(line("fit on all rows, in-sample", errors(rows, g)))
    print()
    print(preset_text(g, args.steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
