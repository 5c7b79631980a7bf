"""Time the real vLLM CPU engine's steps and write them as `steps.jsonl` rows (the GPU format).

    python -m benchmarks.sim.measure_cpu --model smollm2 --out benchmarks/sim/data/cpu
    python -m benchmarks.sim.measure_cpu --model tiny --out benchmarks/sim/data/cpu

Starts the server the integration tests use (`rollout_service.local.vllm_local`, the same flags)
pinned to one core (`--cpus`, default "0": an engine is one core here, as it is one GPU in the
simulator), and reads vLLM's own per-request timings (`--enable-per-request-metrics`):

- **prefill** rows (B = 0): one prompt of k random tokens, `max_tokens: 1`; the row's time is
  the request's `time_to_first_token_ms` (scheduled to first token: one engine step). With a
  cached prefix P (a multiple of the CPU's 128-token KV block, sent once before), k tokens after it.
- **decode** rows (k = 0): B prompts of c tokens prefilled first (`max_tokens: 1`, so the prefix
  cache holds their whole blocks), then the same B sent at once with `max_tokens: n`,
  `ignore_eos`; the row's time is the median over the B requests of `mean_itl_ms` (one decode
  step), at C = c + n/2 context tokens.

- **mixed** rows: B sequences decoding (as above, `max_tokens` 256) and, 0.3 s later, one prompt
  of k tokens: its time to first token is the step that carried it beside the B decodes.

Each row is the median of `--reps` repetitions; every row records the load average when it ran
(the machine is shared).

Non-goals: fitting (that is `benchmarks.sim.cpu_preset`), GPUs (`measure.py`), chunked prefill.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import statistics
import sys
from pathlib import Path

import httpx

from benchmarks.sim.shape import CPU_MODELS
from rollout_service.local import vllm_local

PREFILL_K = (16, 64, 256, 512, 1024, 2048)
PREFIX = ((512, 64), (512, 256), (1024, 128), (2048, 256))  # (P cached, k new)
DECODE_B = (1, 2, 4, 8, 16, 32)
DECODE_C = (64, 512, 1536)
MIXED = ((2, 512, 64), (4, 512, 256), (8, 512, 64), (8, 512, 1024), (16, 64, 256))  # (B, c, k)
DECODE_N = 32
MIXED_N = 256  # long enough to outlast the 0.3 s wait and the prefill
BLOCK = 128  # vLLM's CPU KV block: prefix-cache hits count whole blocks only


def _prompt(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(3, vocab) for _ in range(n)]  # 0-2 are special tokens


class Probe:
    def __init__(self, url: str, model: str, vocab: int, seed: int):
        self.url, self.model, self.vocab = url, model, vocab
        self.rng = random.Random(seed)
        self.http = httpx.AsyncClient(timeout=600)

    async def complete(self, prompt: list[int], max_tokens: int) -> dict:
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                "ignore_eos": True}
        r = await self.http.post(f"{self.url}/v1/completions", json=body)
        r.raise_for_status()
        m = r.json().get("metrics") or {}
        if m.get("time_to_first_token_ms") is None:
            raise SystemExit("the server gave no per-request metrics (--enable-per-request-metrics)")
        return m

    async def prefill_ms(self, k: int, prefix: int) -> float:
        head = _prompt(self.rng, prefix, self.vocab)
        if prefix:
            await self.complete(head + _prompt(self.rng, BLOCK, self.vocab), 1)  # caches `prefix` tokens
        m = await self.complete(head + _prompt(self.rng, k, self.vocab), 1)
        return m["time_to_first_token_ms"]

    async def decode_ms(self, b: int, c: int, n: int) -> float:
        prompts = [_prompt(self.rng, c, self.vocab) for _ in range(b)]
        await asyncio.gather(*(self.complete(p, 1) for p in prompts))
        ms = await asyncio.gather(*(self.complete(p, n) for p in prompts))
        return statistics.median(m["mean_itl_ms"] for m in ms)

    async def mixed_ms(self, b: int, c: int, k: int, n: int) -> float:
        """A k-token prefill arriving while B sequences decode: its time to first token is the
        one step that carried it beside the B decodes."""
        prompts = [_prompt(self.rng, c, self.vocab) for _ in range(b)]
        await asyncio.gather(*(self.complete(p, 1) for p in prompts))
        running = [asyncio.ensure_future(self.complete(p, n)) for p in prompts]
        await asyncio.sleep(0.3)  # the B are past their (cached) prefill and decoding
        m = await self.complete(_prompt(self.rng, k, self.vocab), 1)
        await asyncio.gather(*running)
        return m["time_to_first_token_ms"]


def _load() -> float:
    return round(os.getloadavg()[0], 2)


async def measure(url: str, name: str, reps: int, seed: int, out) -> None:
    shape = CPU_MODELS[name]
    base = {"model": name, **shape.row()}
    probe = Probe(url, name, shape.vocab, seed)
    for _ in range(3):  # warm-up: first requests pay one-time costs
        await probe.prefill_ms(64, 0)
        await probe.decode_ms(2, 64, 8)

    async def row(kind: str, B: int, C: int, k: int, P: int, get) -> None:
        vals, loads = [], []
        for _ in range(reps):
            vals.append(await get())
            loads.append(_load())
        d = {**base, "kind": kind, "B": B, "C": C, "k": k, "P": P, "ms": round(statistics.median(vals), 4),
             "ms_min": round(min(vals), 4), "reps": reps, "load": max(loads)}
        print(json.dumps(d), file=out, flush=True)
        print(f"{name} {kind} B={B} C={C} k={k} P={P}: {d['ms']:.2f} ms (load {d['load']})", file=sys.stderr)

    for k in PREFILL_K:
        await row("prefill", 0, 0, k, 0, lambda k=k: probe.prefill_ms(k, 0))
    for p, k in PREFIX:
        await row("prefill", 0, 0, k, p, lambda k=k, p=p: probe.prefill_ms(k, p))
    for c in DECODE_C:
        for b in DECODE_B:
            await row("decode", b, c + DECODE_N // 2, 0, 0, lambda b=b, c=c: probe.decode_ms(b, c, DECODE_N))
    for b, c, k in MIXED:
        await row("mixed", b, c + MIXED_N // 2, k, 0, lambda b=b, c=c, k=k: probe.mixed_ms(b, c, k, MIXED_N))
    await probe.http.aclose()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", choices=sorted(CPU_MODELS))
    ap.add_argument("--out", default="benchmarks/sim/data/cpu", help="folder for steps-MODEL.jsonl and info.jsonl")
    ap.add_argument("--cpus", default="0", help="cores the engine's threads are bound to (default: one, core 0)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--port", type=int, default=18900 + os.getpid() % 90)
    a = ap.parse_args(argv)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that `finally` stops the server
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = vllm_local.prepare_model(a.model)
    proc = vllm_local.start_server(path, a.port, a.model, cpus=a.cpus)
    url = f"http://127.0.0.1:{a.port}"
    try:
        vllm_local.wait_ready(url, 300, proc)
        cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name")), platform.processor())
        info = {"device": f"CPU: {cpu}", "cores": len(a.cpus.replace("-", ",").split(",")), "cpus": a.cpus,
                "vllm": vllm_local.VLLM_SPEC, "model": a.model, "dtype": vllm_local.default_dtype(),
                "kv_cache_gib": 1, "max_num_batched_tokens": 4096, "chunked_prefill": False,
                "load_at_start": _load()}
        with open(out / f"info-{a.model}.json", "w") as f:
            json.dump(info, f, indent=1)
        with open(out / f"steps-{a.model}.jsonl", "w") as f:
            asyncio.run(measure(url, a.model, a.reps, a.seed, f))
    finally:
        vllm_local.stop_server(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
