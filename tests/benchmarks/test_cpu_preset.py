"""The CPU preset (benchmarks/sim/cpu_preset.py): its fit on the shipped rows, the contention
factor, and vLLM's whole-block prefix hits."""

from __future__ import annotations

import pytest

from benchmarks.sim import cpu_preset
from benchmarks.sim.calibrate import errors
from benchmarks.sim.clock import EventLoop
from benchmarks.sim.gpu import SimGPU
from benchmarks.sim.shape import CPU_MODELS


def test_the_shipped_preset_fits_its_rows():
    for model in ("tiny", "smollm2"):
        rows = cpu_preset.rows((model,))
        errs = errors(rows, cpu_preset.preset(model))
        assert errs["prefill"][0] < 0.15 and errs["decode"][0] < 0.2, (model, errs)


def test_slowed_takes_exactly_x_times_as_long_at_every_step():
    g = cpu_preset.preset("tiny")
    s = cpu_preset.slowed(g, 37.0)
    shape = CPU_MODELS["smollm2"]
    for B, C, k, P in ((1, 80, 0, 0), (32, 528, 0, 0), (0, 0, 2048, 0), (8, 512, 256, 1024)):
        assert s.step_s(shape, B, C, k, P) == pytest.approx(37.0 * g.step_s(shape, B, C, k, P), rel=1e-9)


def test_the_cpu_engine_hits_its_prefix_cache_in_whole_blocks():
    cost = cpu_preset.engine("tiny")
    assert cost.prefix_block_tokens == 128 and cost.kv_capacity_tokens == (1 << 30) // (6 * 2 * 2 * 64 * 2)
    gpu = SimGPU("g0", cost, EventLoop(), lambda *_: None, lambda *_: None)
    gpu.touch("t", 300)
    assert gpu.hit("t") == 256  # 44 cached tokens past the last whole block are recomputed
    gpu.touch("t", 100)
    assert gpu.hit("t") == 0
