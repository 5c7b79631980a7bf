"""The PD allocation table's bookkeeping: a grid run in parts joins into one table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.pd_allocation import code_version, join, line, report

ROOT = Path(__file__).resolve().parents[2]


def _seed(seed: int, guided_s: float, code: str | None = None) -> dict:
    r = {"seed": seed, "trajectories": 8, "colocated_s": 100.0, "colocated_tuned_s": 100.0, "best_static": "static-4P",
         "best_static_s": 90.0, "oracle_s": 90.0, "perfect_s": guided_s, "guided_s": guided_s,
         "guided_cold_s": guided_s, "guided_moves": 1, "forecast": None}
    return r if code is None else {**r, "code": code}


def _cell(workload: str, seeds: list[dict], code: str | None = None, model: str = "m", gpus: int = 8) -> dict:
    c = {"model": model, "regime": "r", "workload": workload, "mode": "sync", "gpus": gpus, "engines": gpus,
         "seeds": seeds}
    return c if code is None else {**c, "code": code}


def test_render_joins_a_cells_seeds_across_files_a_later_seed_winning():
    old = {"cells": [_cell("math", [_seed(0, 100.0), _seed(1, 50.0)], code="aaa"), _cell("swe", [_seed(0, 80.0)])]}
    new = {"cells": [_cell("math", [_seed(1, 80.0, "bbb"), _seed(2, 125.0, "bbb")], code="bbb")]}
    cells = join([old, new])
    assert [c["workload"] for c in cells] == ["math", "swe"]
    math = cells[0]
    assert [(r["seed"], r["guided_s"], r["code"]) for r in math["seeds"]] == [
        (0, 100.0, "aaa"), (1, 80.0, "bbb"), (2, 125.0, "bbb")]
    assert math["code"] == "aaa+bbb"
    # the summary is recomputed over the joined seeds: 100/100, 100/80, 100/125
    assert math["summary"]["guided/colocated"] == {"median": 1.0, "min": 0.8, "max": 1.25}
    assert cells[1]["code"] == "unknown" and len(cells[1]["seeds"]) == 1


def test_joined_cells_keep_a_models_sizes_together():
    first = {"cells": [_cell("math", [_seed(0, 90.0)], model="a", gpus=32), _cell("math", [_seed(0, 90.0)], model="b")]}
    later = {"cells": [_cell("math", [_seed(0, 90.0)], model="a", gpus=8)]}
    assert [(c["model"], c["gpus"]) for c in join([first, later])] == [("a", 8), ("a", 32), ("b", 8)]


def test_each_run_records_the_commit_it_ran_at():
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    code = code_version()
    if head.returncode != 0:  # not a checkout
        assert code == "unknown"
    else:
        assert head.stdout.startswith(code.removesuffix("-dirty").rsplit("-g", 1)[-1])


def test_the_summary_counts_the_cells_within_2_percent_of_the_best_split():
    cells = join([{"cells": [_cell("math", [_seed(0, 91.0)]), _cell("swe", [_seed(0, 95.0)])]}])
    lines: list[str] = []
    report(cells, [0], 1.0, lines.append)
    # 90/91 = 0.989 >= 0.98; 90/95 = 0.947 < 0.98
    assert "guided >= 0.98x of the best split in 1/2 (50%)" in lines[-2]


def test_render_takes_a_file_it_rendered_before(tmp_path):
    joined = {"parts": [{"models": "m", "seeds": "0"}], "cost": {}, "wall_s": 2.0,
              "cells": [_cell("math", [_seed(0, 100.0, "aaa")], code="aaa")]}
    run = {"args": {"models": "m", "seeds": "1", "out": "/somewhere/x.json"}, "cost": {"m": {}}, "wall_s": 3.0,
           "cells": [_cell("math", [_seed(1, 80.0, "bbb")], code="bbb")]}
    (tmp_path / "a.json").write_text(json.dumps(joined))
    (tmp_path / "b.json").write_text(json.dumps(run))
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "pd_allocation.py"), "--render",
                        f"{tmp_path / 'a.json'},{tmp_path / 'b.json'}", "--out", str(tmp_path / "o.json")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads((tmp_path / "o.json").read_text())
    assert out["parts"] == [{"models": "m", "seeds": "0"}, {"models": "m", "seeds": "1"}]  # no machine path
    assert out["wall_s"] == 5.0 and [r["seed"] for r in out["cells"][0]["seeds"]] == [0, 1]
    assert "seeds [0, 1]" in p.stdout


def test_a_cells_best_split_label_is_the_commonest_and_a_tie_goes_to_the_lowest_seed():
    seeds = [{**_seed(i, 90.0), "best_static": name} for i, name in enumerate(["static-3P", "static-1P", "static-2P"])]
    cell = join([{"cells": [_cell("math", seeds)]}])[0]
    assert "(static-3P)" in line(cell)  # a set's order of the names once chose, and varied from run to run
    cell["seeds"][2]["best_static"] = "static-1P"
    assert "(static-1P)" in line(cell)
