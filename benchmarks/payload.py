"""Trajectory payloads, JSON against the compact form, from Redis through a real gateway into arrays.

Stores N finished trajectories of T tokens each (default 1,000 x 32k) in a private Redis, serves
them from a gateway process, and fetches the whole batch with the trainer SDK three ways, side by
side in one run: JSON (`compact=False`), the compact form without zstd, and the compact form as
the SDK reads it by default (zstd on the wire). Each fetch ends with every training sample as
numpy arrays (token ids, loss mask, logprobs), so the times are end to end into the trainer's
tensors. Prints bytes per token (on the wire, and at rest in Redis) and fetch time for each,
with the ratios against JSON, and writes JSON.

The data is seeded and synthetic, shaped like an agentic episode: T/1024 turns of 1024 tokens,
an observation then a sampled reply (`--sampled` of them, half by default), ids Zipf-distributed over a 151,936-token vocabulary (so
int32 is needed; frequent tokens have small ids, as in BPE vocabularies), logprobs of sampling at
temperature 1 (mostly near 0, a long negative tail) as float32, and the transcript text (4 bytes
a token) that JSON and the compact form both carry. No repeated passages: a real SWE trajectory,
re-reading files, compresses better than this.

    python benchmarks/payload.py                       # 1,000 x 32k (needs ~6 GB of memory)
    python benchmarks/payload.py --n 50 --tokens 8192  # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import redis.asyncio as aioredis

from benchmarks.redis_private import PrivateRedis, free_port
from scheduler.keys import Keys
from scheduler.queue import Queue
from trainer_client import RolloutClient
from trainer_client.tensors import as_numpy
from wire import Message, RolloutRequest, Trajectory, TrajectoryState, Turn

VOCAB = 151_936
TURN = 1024  # tokens per turn: prompt (observation) then sampled


def synthetic(rng: np.random.Generator, tokens: int, sampled: float = 0.5) -> Trajectory:
    words = [f" w{i % 9973:x}"[: 1 + i % 5] for i in range(4096)]  # text: ~4 bytes a token, as BPE text runs
    turns, messages = [], []
    out = max(round(TURN * sampled), 1)
    for i in range(max(tokens // TURN, 1)):
        ids = np.minimum(rng.zipf(1.2, TURN), VOCAB) - 1
        lp = np.where(rng.random(out) < 0.7, -np.exp(rng.normal(-6, 2, out)), -rng.exponential(1.5, out))
        turns.append(Turn(index=i, prompt_ids=ids[:-out].tolist(), output_ids=ids[-out:].tolist(),
                          output_logprobs=lp.astype(np.float32).tolist(), finish_reason="stop", policy_version=1,
                          engine_id="engine-0"))
        messages += [Message(role="user", content="".join(words[t % 4096] for t in ids[:-out])),
                     Message(role="assistant", content="".join(words[t % 4096] for t in ids[-out:]))]
    return Trajectory(id="x", batch_id="x", group_index=0, sample_index=0, env="swe", task={"repo": "r", "issue": 1},
                      state=TrajectoryState.completed, reward=1.0, turns=turns, messages=messages, active_s=12.5)


async def load(redis_url: str, prefix: str, n: int, tokens: int, sampled: float,
               seed: int) -> tuple[str, int, int, int]:
    """A batch of n finished trajectories; returns (batch id, JSON bytes, bytes at rest, tokens)."""
    r = aioredis.from_url(redis_url)
    q, keys = Queue(r, Keys(prefix)), Keys(prefix)
    rng = np.random.default_rng(seed)
    templates = [synthetic(rng, tokens, sampled) for _ in range(8)]
    b = await q.enqueue(RolloutRequest(tasks=[{"i": i} for i in range(n)], env="swe"))
    json_bytes = at_rest = count = 0
    while (c := await q.claim("bench")) is not None:
        _, g, _ = c.trajectory_id.rsplit("-", 2)
        t = templates[int(g) % 8].model_copy(update={"id": c.trajectory_id, "batch_id": b.id, "group_index": int(g)})
        assert await q.complete(c, t)
        json_bytes += len(t.model_dump_json())
        at_rest += await r.hstrlen(keys.traj(c.trajectory_id), "result")
        count += sum(len(x.prompt_ids) + len(x.output_ids) for x in t.turns)
    await r.aclose()
    return b.id, json_bytes, at_rest, count


class Counting(httpx.HTTPTransport):
    """Counts the bytes that crossed the socket (before any Content-Encoding is undone)."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        r = super().handle_request(request)
        inner, outer = r.stream, self

        class Stream(httpx.SyncByteStream):
            def __iter__(self):
                for chunk in inner:
                    outer.bytes += len(chunk)
                    yield chunk

            def close(self):
                inner.close()

        r.stream = Stream()
        return r


def fetch(url: str, bid: str, way: str, page: int) -> tuple[float, int, int]:
    """Every trajectory of the batch into numpy arrays; (seconds, wire bytes, tokens seen)."""
    transport = Counting()
    headers = {"Accept-Encoding": "identity"} if way == "compact_plain" else {}
    with RolloutClient(url, compact=way != "json", transport=transport, timeout=600) as c:
        c._http.headers.update(headers)
        t0, seen = time.perf_counter(), 0
        trajs = c.trajectories(bid, page) if way == "json" else c.packed_trajectories(bid, page)
        for t in trajs:
            for s in t.samples():
                ids, mask, lps = as_numpy(s)
                seen += len(ids)
        return time.perf_counter() - t0, transport.bytes, seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1000, help="trajectories")
    ap.add_argument("--tokens", type=int, default=32_768, help="tokens per trajectory")
    ap.add_argument("--sampled", type=float, default=0.5, help="fraction of each turn's tokens that are sampled "
                    "(the rest: the observation); 0.25 is SWE-like, 0.9 math-like")
    ap.add_argument("--page", type=int, default=50, help="trajectories per page fetched")
    ap.add_argument("--repeats", type=int, default=3, help="fetches of each kind, interleaved; medians reported")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/payload.json")
    a = ap.parse_args()
    with PrivateRedis() as redis_url:
        prefix, port = "bench:payload:", free_port()
        t0 = time.perf_counter()
        bid, json_rest, packed_rest, tokens = asyncio.run(load(redis_url, prefix, a.n, a.tokens, a.sampled, a.seed))
        print(f"stored {a.n} trajectories, {tokens / a.n:.0f} tokens each, in {time.perf_counter() - t0:.1f} s")
        env = {**os.environ, "ROLLOUT_REDIS_URL": redis_url, "ROLLOUT_KEY_PREFIX": prefix,
               "ROLLOUT_RESULT_RETENTION_S": "0"}
        gw = subprocess.Popen([sys.executable, "-m", "uvicorn", "--factory", "rollout_service.app:main",
                               "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"], env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(300):
                try:
                    if httpx.get(f"{url}/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
            ways = ("json", "compact_plain", "compact")
            runs: dict[str, list[tuple[float, int, int]]] = {w: [] for w in ways}
            for _ in range(a.repeats):  # interleaved, so drift in machine load hits every way alike
                for w in ways:
                    runs[w].append(fetch(url, bid, w, a.page))
        finally:
            gw.terminate()
            gw.wait(30)
    res: dict = {"n": a.n, "tokens_per_trajectory": tokens / a.n, "sampled": a.sampled, "repeats": a.repeats,
                 "page": a.page,
                 "at_rest_bytes_per_token": {"json": json_rest / tokens, "compact": packed_rest / tokens}}
    for w in ways:
        secs = statistics.median(r[0] for r in runs[w])
        assert all(r[2] == tokens for r in runs[w]), "a fetch missed tokens"
        res[w] = {"seconds": secs, "wire_bytes_per_token": runs[w][0][1] / tokens, "tokens_per_s": tokens / secs}
    print(f"at rest, bytes per token: JSON (before) {res['at_rest_bytes_per_token']['json']:.2f}, "
          f"compact (zstd) {res['at_rest_bytes_per_token']['compact']:.2f}, ratio "
          f"{json_rest / packed_rest:.2f}x")
    for w in ways:
        print(f"{w:14s} wire bytes per token {res[w]['wire_bytes_per_token']:6.2f}   "
              f"fetch into arrays {res[w]['seconds']:7.2f} s (median of {a.repeats})")
    for w in ways[1:]:
        res[w]["smaller_than_json"] = res["json"]["wire_bytes_per_token"] / res[w]["wire_bytes_per_token"]
        res[w]["faster_than_json"] = res["json"]["seconds"] / res[w]["seconds"]
        print(f"{w:14s} vs JSON: {res[w]['smaller_than_json']:.2f}x smaller on the wire, "
              f"{res[w]['faster_than_json']:.2f}x faster end to end")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
