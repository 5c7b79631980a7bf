"""benchmarks/sim/measure.py on the CPU with a tiny shape: the rows calibrate reads (no GPU here)."""

from __future__ import annotations

import json

import pytest

from benchmarks.sim import calibrate
from benchmarks.sim.shape import FIELDS

measure = pytest.importorskip("benchmarks.sim.measure", reason="needs torch (the engine extra)")


def test_measure_writes_the_steps_format_on_cpu(tmp_path):
    assert measure.main(["--out", str(tmp_path), "--models", "tiny,tiny@tp2", "--grid", "tiny",
                         "--seconds-per-config", "0.02"]) == 0
    lines = [json.loads(x) for x in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert len(lines) == 2 * 6 and not [x for x in lines if "error" in x]
    assert {x["kind"] for x in lines} == {"decode", "prefill", "mixed"}
    assert all(set(FIELDS) | {"kind", "B", "C", "k", "P", "ms", "ms_min"} <= set(x) for x in lines)
    assert lines[-1]["model"] == "tiny-tp2" and lines[-1]["tp"] == 2 and lines[-1]["heads"] == 2
    rows = calibrate.load(tmp_path / "steps.jsonl")  # what calibrate fits
    assert len(rows) == 12 and all(r.ms > 0 for r in rows)
    info = [json.loads(x) for x in (tmp_path / "info.jsonl").read_text().splitlines()]
    assert info[0]["device"] == "cpu" and {x.get("model") for x in info[1:]} == {"tiny", "tiny-tp2"}


def test_the_switch_cost_is_the_median_of_the_measured_captures():
    """`GRAPH_CAPTURE_S` traces to data/h200/capture.jsonl: the median total per (model, run)."""
    import statistics
    from collections import defaultdict

    from benchmarks.sim.cost import DATA, GRAPH_CAPTURE_S

    totals: dict[tuple, float] = defaultdict(float)
    sizes: dict[tuple, set] = defaultdict(set)
    for line in (DATA / "capture.jsonl").read_text().splitlines():
        row = json.loads(line)
        totals[row["model"], row["run"]] += (row["warmup_ms"] + row["capture_ms"]) / 1e3
        sizes[row["model"], row["run"]].add(row["B"])
    assert len(totals) == 4 and all(s == set(measure.CAPTURE_SIZES) for s in sizes.values())
    assert abs(statistics.median(totals.values()) - GRAPH_CAPTURE_S) < 0.05
