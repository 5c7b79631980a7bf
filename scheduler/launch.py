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

    ranked = plan(candidates(32, [1, 4, 8]), demands, {1: c1, 4: c4, 8: c8})
    best, seconds = ranked[0]   # e.g. Launch(8, 3, prefill=8, prefill_size=1): 8 x 1 GPU prefill, 3 x 8 decode

The live allocator (`scheduler.pd_control`) records each decision's demand and, for engines of
one size, its measured step model (`Registry.record_phase`, `save_profile`); `rollout launch-plan`
ranks launches from them. Only sizes some phase ran at are compared: a size never run has no
measured step model, and this module does not extrapolate one.

Non-goals: starting engines (the deployment does), moving roles within a launch (the allocator),
measuring (`scheduler.capacity`), forecasting (`scheduler.forecast`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from scheduler.allocator import INF, Allocator, AllocatorConfig, Layout
from scheduler.capacity import Capacity
from scheduler.forecast import Demand


# a split's prefill share of the engines, where there are too many engines to try every split
SPLITS = (1 / 8, 1 / 4, 3 / 8, 1 / 2, 5 / 8, 3 / 4)


def splits(n: int) -> list[int]:
    """Prefill engine counts to try among `n` engines: every one up to 8 engines, else `SPLITS`."""
    if n <= 8:
        return list(range(1, n))
    return sorted({min(max(1, round(f * n)), n - 1) for f in SPLITS})


def role_splits(gpus: int, a: int, b: int, most: int) -> list[tuple[int, int]]:
    """(prefill engines of size a, decode engines of size b) using every GPU, at most `most` of
    them: where there are more, the ones whose prefill share of the GPUs is nearest `SPLITS`."""
    out = [(p, (gpus - p * a) // b) for p in range(1, gpus // a + 1)
           if gpus - p * a >= b and (gpus - p * a) % b == 0]
    if len(out) <= most:
        return out
    picked = {min(out, key=lambda pd: abs(pd[0] * a / gpus - f)) for f in SPLITS}
    return sorted(picked)[:most]


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

    def describe(self) -> str:
        if not self.prefill and not self.decode:
            return f"{self.mixed} colocated x {self.size} GPU"
        head = f"{self.prefill} prefill x {self.prefill_gpus} GPU + {self.decode} decode x {self.size} GPU"
        return head + (f" + {self.mixed} mixed x {self.size} GPU" if self.mixed else "")


def candidates(gpus: int, sizes: Iterable[int], most: int = 6) -> list[Launch]:
    """Launches of `gpus` GPUs: colocated and every split (`splits`) at each size that divides
    them, and splits whose prefill and decode engines differ in size (`role_splits`)."""
    sizes = sorted(set(sizes))
    out = []
    for t in sizes:
        n = gpus // t
        if n >= 1 and gpus % t == 0:
            out.append(Launch(t, 0, n))
            out += [Launch(t, n - p, prefill=p) for p in splits(n)] if n >= 2 else []
    for a in sizes:
        for b in sizes:
            if a != b:
                out += [Launch(b, d, prefill=p, prefill_size=a) for p, d in role_splits(gpus, a, b, most)]
    return out


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


def plan(launches: Iterable[Launch], demands: Sequence[Demand], profiles: Mapping[int, Capacity],
         config: AllocatorConfig | None = None) -> list[tuple[Launch, float]]:
    """Every launch with its score, best first; on a tie colocated before a split, and fewer,
    larger engines before more, smaller ones (fewer engines to start and to route among)."""
    if not demands:
        raise ValueError("no demand to plan for: a phase must run (and be forecast) first")
    cands = list(dict.fromkeys(launches))
    if len({c.gpus for c in cands}) > 1:
        raise ValueError(f"candidates use different GPU counts: {sorted({c.gpus for c in cands})}")
    scored = [(c, score(c, demands, profiles, config)) for c in cands]
    return sorted(scored, key=lambda x: (x[1], x[0].prefill + x[0].decode > 0, x[0].prefill + x[0].decode + x[0].mixed))
