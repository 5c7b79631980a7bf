"""Measure engine step costs on this machine's GPU, in the format `calibrate` fits.

    python -m benchmarks.sim.measure --out runs/mygpu                       # 8B + 32B@tp4, ~10 min
    python -m benchmarks.sim.calibrate runs/mygpu/steps.jsonl --name mygpu  # prints a GPU preset

One step of a continuous-batching engine, rebuilt from plain PyTorch ops at a model's per-GPU
shape (`shape.Shape`, `name@tpN` for a tensor-parallel shard) with random bf16 weights:
the fused QKV, output, gate+up and down matmuls run once over all B + k tokens; attention runs
per kind — B decode queries over C cached tokens each, then the k-token chunk over its P-token
prefix plus itself (causal, lower-right aligned) — through `scaled_dot_product_attention` with
GQA; then the LM head and an argmax for each sampled row. On CUDA the step is captured in a CUDA
graph and replayed, so `ms` is GPU time (median of three timed batches of replays; `ms_min` the
fastest). Lines go to OUT/steps.jsonl (the fields of `data/h200/steps.jsonl`) and OUT/info.jsonl
(device, SM count, memory, a matmul and a copy ceiling).

What it leaves out, as the H200 data does: writing the new tokens' KV, RoPE, sampling beyond
argmax, paged KV, the engine's CPU time, and for tp > 1 the all-reduces (one GPU times one
rank's compute). KV larger than `--kv-budget-gb` is shared between layers (each buffer still far
larger than any cache), so a batch that would not fit is timed anyway and flagged
`fits: false`.

On a machine without CUDA it runs eagerly on the CPU: only for testing this script (`--grid
tiny --models tiny`).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.sim.shape import MODELS, Shape

TINY = Shape(256, 2, 4, 2, 64, 512, 1000)  # CPU smoke test only
GRIDS = {
    # decode (B, C) with B·C ≤ 2.1M; prefill (k, P); mixed (B, C, k, P)
    "full": {
        "decode": [(b, c) for b in (1, 8, 32, 64, 128, 256, 512) for c in (512, 2048, 8192, 32768) if b * c <= 2_100_000],
        "prefill": [(k, 0) for k in (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)]
        + [(k, p) for k in (256, 1024, 4096) for p in (4096, 16384, 32768)],
        "mixed": [(b, c, k, 0) for b in (32, 128, 256) for c in (2048, 8192) for k in (256, 512, 1024, 2048, 4096)]
        + [(128, 4096, k, p) for k in (512, 2048) for p in (8192, 32768)]},
    "quick": {
        "decode": [(b, c) for b in (1, 64, 256) for c in (2048, 8192)],
        "prefill": [(k, 0) for k in (256, 2048, 8192)] + [(256, p) for p in (4096, 16384, 32768)],
        "mixed": [(128, c, k, 0) for c in (2048, 8192) for k in (512, 2048)]
        + [(128, 4096, k, p) for k in (512, 2048) for p in (8192, 32768)]},
    "none": {"decode": [], "prefill": [], "mixed": []},  # with --capture: capture times only
    "tiny": {"decode": [(1, 64), (4, 128)], "prefill": [(32, 0), (16, 64)], "mixed": [(4, 128, 32, 0), (2, 64, 16, 32)]},
}


def parse_model(spec: str) -> tuple[str, Shape]:
    """'llama3-8b', 'qwen2.5-32b@tp4' or 'tiny' -> (name as written in the rows, shard shape)."""
    base, _, tp = spec.partition("@tp")
    shape = TINY if base == "tiny" else MODELS[base]
    return (f"{base}-tp{tp}" if tp else base), (shape.shard(int(tp)) if tp else shape)


class Shard:
    """Random weights of one GPU's share of a LLaMA-layout decoder."""

    def __init__(self, s: Shape, device: str, dtype: torch.dtype):
        g = torch.Generator(device=device).manual_seed(0)

        def w(*dims):
            return torch.randn(*dims, device=device, dtype=dtype, generator=g) * 0.02

        self.s = s
        q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
        self.layers = []
        for _ in range(s.layers):
            layer = {"norm1": torch.ones(s.hidden, device=device, dtype=dtype), "qkv": w(s.hidden, q + 2 * kv),
                     "out": w(q, s.hidden)}
            if s.intermediate:
                layer |= {"norm2": torch.ones(s.hidden, device=device, dtype=dtype),
                          "gate_up": w(s.hidden, 2 * s.intermediate), "down": w(s.intermediate, s.hidden)}
            self.layers.append(layer)
        self.head = w(s.hidden, s.vocab)


class Step:
    """Buffers for one (B, C, k, P) and the step over them; calling it runs one step."""

    def __init__(self, m: Shard, B: int, C: int, k: int, P: int, kv_budget: float):
        s, dev, dt = m.s, m.head.device, m.head.dtype
        self.m, self.B, self.k, self.P = m, B, k, P
        self.x = torch.randn(B + k, s.hidden, device=dev, dtype=dt)
        per_token_layer = 2 * s.kv_heads * s.head_dim * 2

        def caches(batch: int, length: int) -> list[torch.Tensor]:
            if not batch * length:
                return []
            n = int(min(s.layers, max(1, kv_budget // (batch * length * per_token_layer))))
            return [torch.randn(2, batch, s.kv_heads, length, s.head_dim, device=dev, dtype=dt) for _ in range(n)]

        self.decode_kv, self.prefill_kv = caches(B, C), caches(1, P + k)
        self.mask = None
        if k and P:
            from torch.nn.attention.bias import causal_lower_right
            self.mask = causal_lower_right(k, P + k)
        self.sampled = torch.tensor(list(range(B)) + ([B + k - 1] if k else []), device=dev)

    def __call__(self) -> torch.Tensor:
        m, s, B, k = self.m, self.m.s, self.B, self.k
        x = self.x
        q_width = s.heads * s.head_dim
        for i, lw in enumerate(m.layers):
            q = (F.rms_norm(x, (s.hidden,), lw["norm1"]) @ lw["qkv"])[:, :q_width]
            parts = []
            if B:
                kv = self.decode_kv[i % len(self.decode_kv)]
                qd = q[:B].reshape(B, s.heads, 1, s.head_dim)
                o = F.scaled_dot_product_attention(qd, kv[0], kv[1], enable_gqa=True)
                parts.append(o.reshape(B, q_width))
            if k:
                kv = self.prefill_kv[i % len(self.prefill_kv)]
                qp = q[B:].reshape(1, k, s.heads, s.head_dim).transpose(1, 2)
                if self.mask is None:
                    o = F.scaled_dot_product_attention(qp, kv[0], kv[1], is_causal=True, enable_gqa=True)
                else:
                    o = F.scaled_dot_product_attention(qp, kv[0], kv[1], attn_mask=self.mask, enable_gqa=True)
                parts.append(o.transpose(1, 2).reshape(k, q_width))
            x = x + (parts[0] if len(parts) == 1 else torch.cat(parts)) @ lw["out"]
            if s.intermediate:
                gu = F.rms_norm(x, (s.hidden,), lw["norm2"]) @ lw["gate_up"]
                x = x + (F.silu(gu[:, : s.intermediate]) * gu[:, s.intermediate:]) @ lw["down"]
        return (x.index_select(0, self.sampled) @ m.head).argmax(-1)


def timed(step: Step, budget_s: float = 0.6) -> tuple[float, float, int, str]:
    """(median ms, min ms, replays per sample, 'graph' | 'eager')."""
    cuda = step.x.is_cuda
    run, mode = step, "eager"
    if cuda:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up outside the capture (allocator, kernel choice)
            step()
            step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        run, mode = graph.replay, "graph"

    def clock(n: int) -> float:
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(n):
                run()
            b.record()
            b.synchronize()
            return a.elapsed_time(b) / n
        t = time.perf_counter()
        for _ in range(n):
            run()
        return (time.perf_counter() - t) * 1e3 / n

    clock(2)
    reps = max(2, min(20, int(budget_s * 1e3 / max(clock(1), 0.1) / 3)))
    samples = sorted(clock(reps) for _ in range(3))
    return samples[1], samples[0], reps, mode


# Decode batch sizes a serving engine captures CUDA graphs for: 1, 2, 4, then every multiple of 8 up to
# 512 (vLLM's default list for 512 sequences has this form; SGLang's is similar). A role switch that
# changes the batch shapes an engine runs re-captures them, so this is the flip's graph-capture cost.
CAPTURE_SIZES = [1, 2, 4] + list(range(8, 513, 8))


def capture(m: Shard, C: int, kv_budget: float, sizes: list[int]) -> list[dict]:
    """Time capturing one decode-step CUDA graph per batch size, largest first, into one shared
    memory pool (as engines do), after two warm-up runs of each shape (counted apart)."""
    rows, pool, graphs = [], None, []
    for B in sorted(sizes, reverse=True):
        step = Step(m, B, C, 0, 0, kv_budget)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
            step()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            step()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        pool = g.pool()
        graphs.append((g, step))  # kept alive: the engine holds every graph it captured
        rows.append({"B": B, "C": C, "warmup_ms": round((t1 - t0) * 1e3, 2), "capture_ms": round((t2 - t1) * 1e3, 2)})
    return rows


def ceilings(device: str) -> dict:
    if device != "cuda":
        return {}
    n = 8192
    a, b = torch.randn(n, n, device=device, dtype=torch.bfloat16), torch.randn(n, n, device=device, dtype=torch.bfloat16)
    x = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)

    def ms(fn, reps=10):
        fn()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(reps):
            fn()
        e1.record()
        e1.synchronize()
        return e0.elapsed_time(e1) / reps

    out = {"bf16_matmul_tflops": round(2 * n ** 3 / ms(lambda: torch.mm(a, b)) / 1e9, 1),
           "d2d_copy_tb_s": round(2 * x.numel() / ms(lambda: y.copy_(x)) / 1e9, 2)}
    a = b = x = y = None  # free before the models load
    torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for steps.jsonl and info.jsonl (appended to)")
    ap.add_argument("--models", default="llama3-8b,qwen2.5-32b@tp4",
                    help=f"comma list of {sorted(MODELS)} or tiny, each optionally @tpN")
    ap.add_argument("--grid", choices=sorted(GRIDS), default=None, help="default: full for the first model, quick after")
    ap.add_argument("--budget-s", type=float, default=1800, help="stop starting new configurations after this")
    ap.add_argument("--kv-budget-gb", type=float, default=30.0)
    ap.add_argument("--seconds-per-config", type=float, default=0.6, help="timing budget of one configuration")
    ap.add_argument("--run", type=int, default=1, help="written into each row, to tell repeated runs apart")
    ap.add_argument("--capture", action="store_true",
                    help="after each model's grid, time CUDA-graph capture of its decode step at CAPTURE_SIZES "
                         "(capture.jsonl; CUDA only)")
    args = ap.parse_args(argv)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32  # CPU: only a test of the code path
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def write(name: str, rec: dict) -> None:
        with open(out / name, "a") as f:
            f.write(json.dumps(rec) + "\n")

    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info = {"device": props.name, "sms": props.multi_processor_count, "memory_gb": round(props.total_memory / 1e9, 1)}
    else:
        info = {"device": "cpu", "sms": os.cpu_count(), "memory_gb": None}
    info |= {"torch": torch.__version__, **ceilings(device)}
    write("info.jsonl", info)
    print(json.dumps(info), flush=True)
    t0 = time.monotonic()
    kv_budget = args.kv_budget_gb * 1e9
    for i, spec in enumerate(args.models.split(",")):
        name, shape = parse_model(spec)
        grid = GRIDS[args.grid or ("full" if i == 0 else "quick")]
        m = Shard(shape, device, dtype)
        write("info.jsonl", {"model": name, "params_this_gpu": shape.params(),
                             "kv_bytes_per_token": shape.kv_bytes_per_token()})
        configs = ([("decode", b, c, 0, 0) for b, c in grid["decode"]] + [("prefill", 0, 0, k, p) for k, p in grid["prefill"]]
                   + [("mixed", *x) for x in grid["mixed"]])
        for kind, B, C, k, P in configs:
            if time.monotonic() - t0 > args.budget_s:
                print("budget spent", flush=True)
                return 0
            row = {"model": name, **shape.row(), "kind": kind, "B": B, "C": C, "k": k, "P": P}
            try:
                med, low, reps, mode = timed(Step(m, B, C, k, P, kv_budget), args.seconds_per_config)
                gb = (shape.weight_bytes() + (B * C + P + k) * shape.kv_bytes_per_token()) / 1e9
                row |= {"ms": round(med, 4), "ms_min": round(low, 4), "reps": reps, "mode": mode,
                        "attn": "full" if kind == "decode" else ("lower_right" if P else "causal"), "run": args.run,
                        "gb_needed": round(gb, 1), "fits": info["memory_gb"] is None or gb <= info["memory_gb"]}
            except torch.OutOfMemoryError:
                row["error"] = "oom"
            except Exception as e:  # noqa: BLE001 — one bad configuration is a row, not the end of the run
                row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            if device == "cuda":
                torch.cuda.empty_cache()
            write("steps.jsonl", row)
            print(json.dumps(row), flush=True)
        if args.capture and device == "cuda":
            rows = capture(m, 256, 0.0, CAPTURE_SIZES)  # one KV buffer per step: every graph stays alive
            for r in rows:
                write("capture.jsonl", {"model": name, **shape.row(), **r})
            total = sum(r["warmup_ms"] + r["capture_ms"] for r in rows) / 1e3
            print(json.dumps({"model": name, "graphs": len(rows), "capture_total_s": round(total, 2)}), flush=True)
            torch.cuda.empty_cache()
        del m
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
