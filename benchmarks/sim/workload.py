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
| web (long observations) | 1,000–3,000 | 4–16 | 200, σ 0.6 (first ×2) | `browse` 2 s, σ 0.8 | 5,000, σ 0.6, 2k–16k |
| doc (long first prompt) | 8,000–32,000 | 2–6 | 400, σ 0.6 | `lookup` 1 s, σ 0.8 | 300, σ 0.9 |
| reason (long outputs) | 200–800 | 1–3 | 4,000, σ 0.5, ≤ 16k | `check` 0.5 s, σ 0.5 | 200, σ 0.5 |

A `Workload` is a mix of profiles that may shift with progress (0 → 1 across the run: the
batch index in synchronous mode, the submission index in asynchronous mode), and how many
trajectories run per GPU. Episode i of a run is drawn from its own generator seeded by
(seed, i), so every policy sees the same episodes. With `group` = G > 1 episodes come in GRPO
groups of G that share their environment and opening prompt (`Episode.group`): an engine that
has prefilled the prompt for one member reuses it for the others (`benchmarks.sim.cluster`).

Workloads: `math`, `coding`, `swe`, `mix` (math → coding → swe as the run progresses), and
`web` (long observations), `doc` (long first prompts), `reason` (long outputs), `shift`
(reason → web: decode-bound first, prefill-bound last, so the best prefill:decode ratio moves
several-fold; no claim is made about by how much), `grpo` (coding in groups of 16).

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
    min_observation: int = 1


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
    group: str | None = None  # GRPO group: members share the opening prompt


def draw_episode(p: EnvProfile, tid: str, rng: random.Random) -> Episode:
    n = rng.randint(*p.turns)
    turns = []
    for i in range(n):
        r = p.response.draw(rng) * (p.first_x if i == 0 and n > 1 else 1.0)
        turns.append(TurnSpec(max(int(r), 1), p.latency.draw(rng), max(int(p.observation.draw(rng)), p.min_observation)))
    return Episode(tid, p.name, p.tool, rng.randint(*p.prompt), turns)


MATH = EnvProfile("math", (100, 400), (1, 1), LogNormal(700, 0.7, 8192), LogNormal(0.01, 0.1, 0.1),
                  LogNormal(1, 0.0, 1), "grader")
CODING = EnvProfile("coding", (400, 1200), (3, 12), LogNormal(300, 0.6, 4096), LogNormal(1.5, 0.8, 60.0),
                    LogNormal(400, 0.9, 6000), "python", first_x=2.0)
SWE = EnvProfile("swe", (1500, 4000), (10, 40), LogNormal(250, 0.6, 4096), LogNormal(3.0, 1.0, 120.0),
                 LogNormal(700, 1.0, 8000), "bash", first_x=2.0)
WEB = EnvProfile("web", (1000, 3000), (4, 16), LogNormal(200, 0.6, 4096), LogNormal(2.0, 0.8, 60.0),
                 LogNormal(5000, 0.6, 16000), "browse", first_x=2.0, min_observation=2000)
DOC = EnvProfile("doc", (8000, 32000), (2, 6), LogNormal(400, 0.6, 4096), LogNormal(1.0, 0.8, 30.0),
                 LogNormal(300, 0.9, 4000), "lookup")
REASON = EnvProfile("reason", (200, 800), (1, 3), LogNormal(4000, 0.5, 16384), LogNormal(0.5, 0.5, 10.0),
                    LogNormal(200, 0.5, 2000), "check")
PROFILES = {p.name: p for p in (MATH, CODING, SWE, WEB, DOC, REASON)}


@dataclass(slots=True)
class Workload:
    """`mix(progress) -> {env: weight}`; `per_gpu` trajectories in flight per GPU; `rounds`
    batches (sync) or concurrency multiples of total trajectories (async)."""

    name: str
    mix: Callable[[float], dict[str, float]]
    per_gpu: int
    rounds: int = 1
    profiles: dict[str, EnvProfile] = field(default_factory=lambda: dict(PROFILES))
    group: int = 1  # GRPO group size: consecutive episodes share env and opening prompt

    def episode(self, seed: int, index: int, progress: float) -> Episode:
        rng = random.Random(f"{seed}:{self.name}:{index}")
        g = index // self.group
        shared = random.Random(f"{seed}:{self.name}:group{g}") if self.group > 1 else rng
        mix = self.mix(progress)
        names = sorted(mix)
        env = shared.choices(names, weights=[mix[n] for n in names])[0]
        ep = draw_episode(self.profiles[env], f"t{index}", rng)
        if self.group > 1:
            ep.prompt, ep.group = shared.randint(*self.profiles[env].prompt), f"g{g}"
        return ep


def _shifting(progress: float) -> dict[str, float]:
    """Math-heavy at first, tool-heavy coding in the middle, long-horizon SWE at the end."""
    x = min(max(progress, 0.0), 1.0)
    return {"math": max(1.0 - 2 * x, 0.0) + 0.05, "coding": 1.0 - abs(2 * x - 1.0) + 0.05,
            "swe": max(2 * x - 1.0, 0.0) + 0.05}


def _reason_to_web(progress: float) -> dict[str, float]:
    x = min(max(progress, 0.0), 1.0)
    return {"reason": 1.0 - x + 0.05, "web": x + 0.05}


WORKLOADS: dict[str, Workload] = {
    "math": Workload("math", lambda _: {"math": 1.0}, per_gpu=64, rounds=2),
    "coding": Workload("coding", lambda _: {"coding": 1.0}, per_gpu=32, rounds=2),
    "swe": Workload("swe", lambda _: {"swe": 1.0}, per_gpu=12, rounds=2),
    "mix": Workload("mix", _shifting, per_gpu=24, rounds=3),
    "web": Workload("web", lambda _: {"web": 1.0}, per_gpu=12, rounds=2),
    "doc": Workload("doc", lambda _: {"doc": 1.0}, per_gpu=8, rounds=2),
    "reason": Workload("reason", lambda _: {"reason": 1.0}, per_gpu=32, rounds=2),
    "shift": Workload("shift", _reason_to_web, per_gpu=16, rounds=3),
    "grpo": Workload("grpo", lambda _: {"coding": 1.0}, per_gpu=32, rounds=2, group=16),
}
