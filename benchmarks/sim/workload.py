"""Simulated environments and workloads: what each episode asks of the engines and tools.

An `EnvProfile` draws an episode: an opening prompt, then per turn a response length, a
tool (environment step) latency and an observation length. Lengths and latencies are
lognormal (median, σ), capped. The first turn of a multi-turn episode answers at `first_x`
times the usual length (planning), so response length depends on the turn.

| env | prompt | turns | response (median) | tool latency (median) | observation (median) |
|---|---|---|---|---|---|
| math | 100–400 | 1 | 700, σ 0.7 | 0.01 s (grading) | – |
| coding (tool-heavy) | 400–1,200 | 3–12 | 300, σ 0.6 (first ×2) | `python` 1.5 s, σ 0.8 | 400, σ 0.9 |
| swe (long-horizon) | 1,500–4,000 | 10–40 | 250, σ 0.6 (first ×2) | `bash` 3 s, σ 1.0 | 700, σ 1.0 |

A `Workload` is a mix of profiles that may shift with progress (0 → 1 across the run: the
batch index in synchronous mode, the submission index in asynchronous mode), and how many
trajectories run per GPU. Episode i of a run is drawn from its own generator seeded by
(seed, i), so every policy sees the same episodes.

Non-goals: rewards, text, real tool semantics.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(slots=True, frozen=True)
class LogNormal:
    median: float
    sigma: float
    cap: float

    def draw(self, rng: random.Random) -> float:
        return min(self.median * math.exp(self.sigma * rng.gauss(0.0, 1.0)), self.cap)


@dataclass(slots=True, frozen=True)
class EnvProfile:
    name: str
    prompt: tuple[int, int]
    turns: tuple[int, int]
    response: LogNormal
    latency: LogNormal
    observation: LogNormal
    tool: str
    first_x: float = 1.0


@dataclass(slots=True)
class TurnSpec:
    response: int
    latency_s: float
    observation: int  # tokens the step returns (unused after the last turn)


@dataclass(slots=True)
class Episode:
    id: str
    env: str
    tool: str
    prompt: int
    turns: list[TurnSpec]


def draw_episode(p: EnvProfile, tid: str, rng: random.Random) -> Episode:
    n = rng.randint(*p.turns)
    turns = []
    for i in range(n):
        r = p.response.draw(rng) * (p.first_x if i == 0 and n > 1 else 1.0)
        turns.append(TurnSpec(max(int(r), 1), p.latency.draw(rng), max(int(p.observation.draw(rng)), 1)))
    return Episode(tid, p.name, p.tool, rng.randint(*p.prompt), turns)


MATH = EnvProfile("math", (100, 400), (1, 1), LogNormal(700, 0.7, 8192), LogNormal(0.01, 0.1, 0.1),
                  LogNormal(1, 0.0, 1), "grader")
CODING = EnvProfile("coding", (400, 1200), (3, 12), LogNormal(300, 0.6, 4096), LogNormal(1.5, 0.8, 60.0),
                    LogNormal(400, 0.9, 6000), "python", first_x=2.0)
SWE = EnvProfile("swe", (1500, 4000), (10, 40), LogNormal(250, 0.6, 4096), LogNormal(3.0, 1.0, 120.0),
                 LogNormal(700, 1.0, 8000), "bash", first_x=2.0)
PROFILES = {p.name: p for p in (MATH, CODING, SWE)}


@dataclass(slots=True)
class Workload:
    """`mix(progress) -> {env: weight}`; `per_gpu` trajectories in flight per GPU; `rounds`
    batches (sync) or concurrency multiples of total trajectories (async)."""

    name: str
    mix: Callable[[float], dict[str, float]]
    per_gpu: int
    rounds: int = 1
    profiles: dict[str, EnvProfile] = field(default_factory=lambda: dict(PROFILES))

    def episode(self, seed: int, index: int, progress: float) -> Episode:
        rng = random.Random(f"{seed}:{self.name}:{index}")
        mix = self.mix(progress)
        names = sorted(mix)
        env = rng.choices(names, weights=[mix[n] for n in names])[0]
        return draw_episode(self.profiles[env], f"t{index}", rng)


def _shifting(progress: float) -> dict[str, float]:
    """Math-heavy at first, tool-heavy coding in the middle, long-horizon SWE at the end."""
    x = min(max(progress, 0.0), 1.0)
    return {"math": max(1.0 - 2 * x, 0.0) + 0.05, "coding": 1.0 - abs(2 * x - 1.0) + 0.05,
            "swe": max(2 * x - 1.0, 0.0) + 0.05}


WORKLOADS: dict[str, Workload] = {
    "math": Workload("math", lambda _: {"math": 1.0}, per_gpu=64, rounds=2),
    "coding": Workload("coding", lambda _: {"coding": 1.0}, per_gpu=32, rounds=2),
    "swe": Workload("swe", lambda _: {"swe": 1.0}, per_gpu=12, rounds=2),
    "mix": Workload("mix", _shifting, per_gpu=24, rounds=3),
}
