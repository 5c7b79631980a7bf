"""Fitting GPU figures to measured steps (a small slice of the H200 data), and predicting new ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.sim import calibrate
from benchmarks.sim.hardware import H200
from benchmarks.sim.shape import QWEN25_32B

STEPS = Path(__file__).resolve().parents[2] / "benchmarks" / "sim" / "data" / "h200" / "steps.jsonl"


def small_slice() -> list[calibrate.Row]:
    """About 50 rows: Llama-3-8B decode/prefill/mixed that fit on the GPU, and the TP8 shard."""
    rows = calibrate.load(STEPS)
    return [r for r in rows if r.raw["run"] == 2 or (r.model == "llama3-8b" and r.raw["fits_h200"] and r.B <= 128)][::2]


def test_fit_on_a_small_slice_recovers_the_figures_from_a_wrong_start():
    rows = small_slice()
    assert 40 <= len(rows) <= 80
    wrong = H200.with_params(matmul_flops=200e12, weight_bw=8e12, kv_bw=1e12, gemm_s=30e-6)
    g = calibrate.fit(rows, wrong, tiles=(128,), rects=(True,))
    for kind, (med, worst, _) in calibrate.errors(rows, g).items():
        assert med < 0.06 and worst < 0.3, kind
    assert g.weight_bw == pytest.approx(H200.weight_bw, rel=0.25)
    assert g.matmul_flops == pytest.approx(H200.matmul_flops, rel=0.25)


def test_the_script_reports_in_sample_and_held_out_errors_and_a_preset(tmp_path, capsys):
    data = tmp_path / "steps.jsonl"
    data.write_text("".join(json.dumps(r.raw) + "\n" for r in small_slice()))
    assert calibrate.main([str(data), "--hold-model", "qwen2.5-32b-tp8", "--name", "mine"]) == 0
    out = capsys.readouterr().out
    assert "in-sample" in out and "held out" in out and "MINE = GPU(" in out
    held = next(x for x in out.splitlines() if x.strip().startswith("held out"))
    assert all(k in held for k in ("decode", "prefill", "mixed"))


def test_predict_adds_ms_pred_to_any_shape_with_or_without_ms(tmp_path, capsys):
    known = json.loads(STEPS.read_text().splitlines()[0])
    new = {**QWEN25_32B.shard(2).row(), "kind": "mixed", "B": 96, "C": 3072, "k": 768, "P": 2048}  # never measured
    f = tmp_path / "new.jsonl"
    f.write_text(json.dumps(known) + "\n" + json.dumps(new) + "\n")
    assert calibrate.main(["--predict", str(f)]) == 0
    got = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert got[0]["ms_pred"] == pytest.approx(known["ms"], rel=0.1) and got[0]["ms"] == known["ms"]
    assert got[1]["ms_pred"] > 0 and "ms" not in got[1]
