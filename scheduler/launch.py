"""Which engines to launch: how many prefill, decode and mixed engines, and each role's size.

An engine's size — its tensor parallelism, or for a DP-attention MoE its attention group — is
fixed when vLLM starts it, so the allocator (`scheduler.allocator`) moves roles among engines of
one size. Which size pays, and whether prefill and decode engines should differ (a 32B prefilling
on engines of one GPU for decode engines of eight), depends on the workload. `plan` scores each
candidate launch on the demand the forecaster saw over a whole rollout phase — RL rolls out the
same environments step after step, so the phase before is the forecast for the next — with each
size's step model as measured on engines of that size (a `Capacity` per size), and returns the
candidates best first. A launch's score is the allocator's own estimate (`Allocator.estimate`)
summed over the phase's decisions, its prefill engines priced at their size's capacity.

    ranked = plan([Launch(4, 0, 2), Launch(8, 2, 0, prefill=8, prefill_size=1)], demands, {1: c1, 4: c4, 8: c8})
    best, seconds = ranked[0]

Non-goals: starting engines (the deployment does), moving roles within a launch (the allocator),
measuring (`scheduler.capacity`), forecasting (`scheduler.forecast`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from scheduler.allocator import INF, Allocator, AllocatorConfig, Layout
from scheduler.capacity import Capacity
from scheduler.forecast import Demand


@dataclass(slots=True, frozen=True)
class Launch:
    """`decode` decode and `mixed` mixed engines of `size` GPUs, and `prefill` prefill engines of
    `prefill_size` GPUs (0: `size`)."""

    size: int
    decode: int
    mixed: int = 0
    prefill: int = 0
    prefill_size: int = 0

    def __post_init__(self) -> None:
        if self.size < 1 or self.prefill_size < 0 or min(self.decode, self.mixed, self.prefill) < 0:
            raise ValueError(f"not a launch: {self}")
        if self.prefill + self.decode + self.mixed == 0:
            raise ValueError("a launch needs at least one engine")

    @property
    def prefill_gpus(self) -> int:
        return self.prefill_size or self.size

    @property
    def gpus(self) -> int:
        return self.prefill * self.prefill_gpus + (self.decode + self.mixed) * self.size

    @property
    def layout(self) -> Layout:
        return Layout(self.prefill, self.decode, self.mixed)


def score(launch: Launch, demands: Iterable[Demand], profiles: Mapping[int, Capacity],
          config: AllocatorConfig | None = None) -> float:
    """Seconds the launch needs for every demand in turn (INF where one cannot be served: no
    engine that decodes, say). `profiles`: the step model of an engine of each size."""
    for size in {launch.size, launch.prefill_gpus}:
        if size not in profiles:
            raise KeyError(f"no step model for engines of size {size}: measured sizes {sorted(profiles)}")
    n = launch.prefill + launch.decode + launch.mixed
    a = Allocator([f"e{i}" for i in range(n)], profiles[launch.size], config, launch.layout,
                  prefill_capacity=profiles[launch.prefill_gpus] if launch.prefill else None)
    total = 0.0
    for d in demands:
        s = a.estimate(launch.layout, d)
        if s == INF:
            return INF
        total += s
    return total


def plan(candidates: Iterable[Launch], demands: Sequence[Demand], profiles: Mapping[int, Capacity],
         config: AllocatorConfig | None = None) -> list[tuple[Launch, float]]:
    """Every candidate with its score, best first; on a tie colocated before a split, and fewer,
    larger engines before more, smaller ones (fewer engines to start and to route among)."""
    if not demands:
        raise ValueError("no demand to plan for: a phase must run (and be forecast) first")
    cands = list(dict.fromkeys(candidates))
    if len({c.gpus for c in cands}) > 1:
        raise ValueError(f"candidates use different GPU counts: {sorted({c.gpus for c in cands})}")
    scored = [(c, score(c, demands, profiles, config)) for c in cands]
    return sorted(scored, key=lambda x: (x[1], x[0].prefill + x[0].decode > 0, x[0].prefill + x[0].decode + x[0].mixed))
