"""A recorded batch replayed in the simulator, and the figures that compare it with the real run.

    over = Overhead.from_recording(trajectories)
    wl = recorded_workload(Path("batch.jsonl"), concurrency=16, engines=2, overhead=over)
    sim = simulate(wl, 2, cpu_preset.engine("tiny"), over)
    for line in compare(real_figures(trajectories, makespan_s, busy), sim):
        print(line.text())                     # fidelity makespan_s real=... sim=... error=...%

The workload is the recording's (`trace.trace_workload`, in the order the service queued it):
each episode's turn count, prompt, response and observation lengths, and tool times. The
simulation is `cluster.Cluster` (the real scheduler classes, the engines costed by the CPU
preset), in asynchronous mode with as many trajectories in flight as the service ran
(`ROLLOUT_WORKER_CONCURRENCY`), every engine mixed (what the service does without
`--pd-allocation`).

What the simulator leaves out of a turn, as two named cost terms (`Overhead`), each read off
the same recording; zero gives the engine-only simulation:

- `request_s`: before each engine call, the mean over turns of the worker's elapsed time less
  vLLM's own time to first token and generation time (`Turn.timings.queue_s`): the HTTP round
  trip, vLLM's API server (tokenizing, detokenizing the response) and vLLM's queue wait.
- `turn_s`: after each turn's tool time, the mean over trajectories of the active time that no
  turn accounts for (`active_s` − Σ queue + prefill + decode + tool), per turn: the worker's
  chat template, the turn's Redis write, env open and close spread over the turns.

Or each turn's own (`recorded_workload(per_turn=True)` and `simulate(delays=request_delays(..))`):
the recorded overheads replayed, spread and all.

The engine's own speed is the preset's, one engine alone on an idle core. On a shared machine
the real engine runs slower by a factor that depends on the neighbours, not on the workload;
`contention(real, sim)` reads it off the run (real mean engine time per turn, prefill + decode,
over the simulation's), and `cpu_preset.slowed(preset, x)` applies it. Engines sharing a machine
also run at different speeds; `engine_spread` measures how far apart, `spread_costs` spaces the
simulated engines so. A simulation with both is fitted to the run's engine time per turn: that
is no test of the simulator, but the makespan, latencies and busy fraction still are, and
carried from one run to the next they are a prediction.

Figures: makespan (submission to the last result; the simulation from its start), p50/p90
trajectory latency (the worker's `active_s`: claim to end; the simulation from a slot opening
to the end), mean per-turn prefill time (vLLM: scheduled to first token; the simulation:
the prompt delta handed to an engine to prefilled), mean per-turn decode time (first token to
last), engine busy fraction (real: sampled `vllm:num_requests_running + waiting > 0`).

Non-goals: starting engines or the service (`benchmarks/sim_fidelity.py`), GPUs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean, median

from benchmarks.sim.cluster import Cluster, Policy
from benchmarks.sim.cost import ClusterCost
from benchmarks.sim.cpu_preset import slowed
from benchmarks.sim.trace import TraceWorkload, trace_workload
from rollout_service.recording import read
from wire import Trajectory

FIGURES = ("makespan_s", "latency_p50_s", "latency_p90_s", "prefill_mean_s", "decode_mean_s", "busy_fraction")


@dataclass(slots=True, frozen=True)
class Overhead:
    """Time a turn spends outside the engine and the environment (seconds), with its source."""

    request_s: float = 0.0  # before each engine call: HTTP + vLLM API server + vLLM queue
    turn_s: float = 0.0  # after each turn: worker bookkeeping, env open/close spread over turns
    source: str = "none: the engine-only simulation"

    @staticmethod
    def from_recording(trajs: list[Trajectory], source: str = "") -> Overhead:
        turns = [t for tr in trajs for t in tr.turns]
        gaps = [_gap(tr) for tr in trajs if tr.turns]
        # means, not medians: the terms add up turn after turn, and a mean keeps their total
        # (under load queue_s has a long tail: mean 0.72 s against a median of 0.41 s)
        return Overhead(mean(t.timings.queue_s for t in turns) if turns else 0.0,
                        mean(gaps) if gaps else 0.0, source or "means of the recording")


@dataclass(slots=True)
class Figures:
    makespan_s: float
    latency_p50_s: float
    latency_p90_s: float
    prefill_mean_s: float
    decode_mean_s: float
    busy_fraction: float
    trajectories: int = 0
    turns: int = 0

    @property
    def engine_s(self) -> float:
        """Mean engine time per turn: prefill and decode."""
        return self.prefill_mean_s + self.decode_mean_s

    def row(self) -> dict:
        return {f: round(getattr(self, f), 4) for f in (*FIGURES, "trajectories", "turns")}


def pct(xs: list[float], q: float) -> float:
    """The q-quantile, nearest rank (no interpolation: the figure is one trajectory's)."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))] if s else 0.0


def real_figures(trajs: list[Trajectory], makespan_s: float, busy: float) -> Figures:
    lat = [t.active_s for t in trajs]
    turns = [u for t in trajs for u in t.turns]
    return Figures(makespan_s, pct(lat, 0.5), pct(lat, 0.9), mean(u.timings.prefill_s for u in turns),
                   mean(u.timings.decode_s for u in turns), busy, len(trajs), len(turns))


def _ran(path: Path) -> list[Trajectory]:
    """The recording's trajectories that ran a turn, in the workload's (queue) order."""
    _, records = read(path)
    trajs = sorted((r.trajectory for r in records), key=lambda t: (t.group_index, t.sample_index))
    return [t for t in trajs if t.turns]


def _gap(t: Trajectory) -> float:
    """Active time of `t` that no turn accounts for, per turn."""
    u = t.turns
    return max(t.active_s - sum(x.timings.queue_s + x.timings.prefill_s + x.timings.decode_s + x.timings.tool_s
                                for x in u), 0.0) / len(u)


def recorded_workload(path: Path, concurrency: int, engines: int, overhead: Overhead = Overhead(),
                      per_turn: bool = False) -> TraceWorkload:
    """The recording as a workload: every episode once, in queue order, `concurrency` in flight.
    `overhead.turn_s` is added to every tool time; `per_turn`: each trajectory's own gap instead."""
    ran = _ran(path)
    if len(ran) % concurrency or concurrency % engines:
        raise ValueError(f"{len(ran)} episodes do not split into rounds of {concurrency} over {engines} engines")
    wl = trace_workload(path, per_gpu=concurrency // engines, rounds=len(ran) // concurrency, name=path.stem)
    wl.offset = 0  # the service claims in queue order (group, sample): so does the simulation
    for ep, t in zip(wl.recorded, ran, strict=True):
        for spec in ep.turns:
            spec.latency_s += _gap(t) if per_turn else overhead.turn_s
    return wl


def request_delays(path: Path) -> list[list[float]]:
    """Each recorded turn's own request overhead (`queue_s`), in the workload's order."""
    return [[u.timings.queue_s for u in t.turns] for t in _ran(path)]


class TimedCluster(Cluster):
    """`Cluster` that also times each turn's prefill and decode and each trajectory, and waits
    `Overhead.request_s` before each engine call. Scheduler calls are unchanged."""

    def __init__(self, *a, overhead: Overhead = Overhead(), delays: list[list[float]] | None = None, **kw):
        super().__init__(*a, **kw)
        self.overhead = overhead
        self.delays = delays  # per episode and turn, instead of overhead.request_s (`request_delays`)
        self.started: dict[str, float] = {}
        self.latency: list[float] = []
        self.prefill: list[float] = []
        self.decode: list[float] = []
        self._mark: dict[str, float] = {}

    def _start_turn(self, tid: str, delta: int) -> None:
        self.started.setdefault(tid, self.loop.now)
        wait = self.overhead.request_s
        if self.delays is not None:  # episode "t<i>" is recorded episode i mod n (offset 0)
            wait = self.delays[int(tid[1:]) % len(self.delays)][self.trajs[tid].turn]
        if wait > 0:
            self.loop.after(wait, self._send, (tid, delta))
        else:
            self._send((tid, delta))

    def _send(self, arg: tuple[str, int]) -> None:
        self._mark[arg[0]] = self.loop.now
        super()._start_turn(*arg)

    def _prefilled(self, gpu, tid: str) -> None:
        self.prefill.append(self.loop.now - self._mark[tid])
        super()._prefilled(gpu, tid)

    def _join_decode(self, arg: tuple[str, str]) -> None:
        self._mark[arg[0]] = self.loop.now
        super()._join_decode(arg)

    def _decoded(self, gpu, tid: str) -> None:
        self.decode.append(self.loop.now - self._mark[tid])
        super()._decoded(gpu, tid)

    def _finish(self, tid: str) -> None:
        self.latency.append(self.loop.now - self.started.pop(tid))
        super()._finish(tid)


def contention(real: Figures, sim: Figures) -> float:
    """How many times slower the real engine was than in `sim`, in this run (≥ 1): the ratio of
    their engine time per turn (prefill + decode, what a trajectory waits on the engine for)."""
    return max(real.engine_s / sim.engine_s, 1.0) if sim.engine_s else 1.0


def engine_spread(trajs: list[Trajectory]) -> float:
    """How far apart the engines' speeds were: (slowest − fastest) / (slowest + fastest) of their
    mean engine time per turn (prefill + decode); 0 with one engine."""
    per: dict[str, list[float]] = {}
    for t in trajs:
        for u in t.turns:
            per.setdefault(u.engine_id, []).append(u.timings.prefill_s + u.timings.decode_s)
    means = [mean(v) for v in per.values()]
    return (max(means) - min(means)) / (max(means) + min(means)) if len(means) > 1 and sum(means) else 0.0


def spread_costs(cost: ClusterCost, engines: int, spread: float) -> list[ClusterCost]:
    """Each engine's cost: step times spaced evenly from (1 + spread) to (1 − spread) times
    `cost`'s (`engine_spread`), their mean unchanged."""
    if not spread or engines < 2:
        return [cost] * engines
    return [dataclasses.replace(cost, gpu=slowed(cost.gpu, 1 + spread * (1 - 2 * i / (engines - 1))))
            for i in range(engines)]


def simulate(wl: TraceWorkload, engines: int, cost: ClusterCost, overhead: Overhead = Overhead(),
             delays: list[list[float]] | None = None, spread: float = 0.0) -> Figures:
    """`spread` > 0: engines of unequal speed (`spread_costs`)."""
    c = TimedCluster(wl, engines, Policy.colocated(), "async", cost=cost, overhead=overhead, delays=delays)
    for g, g_cost in zip(c.gpus.values(), spread_costs(cost, engines, spread), strict=True):
        g.cost = g_cost
    res = c.run()
    return Figures(res.makespan_s, pct(c.latency, 0.5), pct(c.latency, 0.9), mean(c.prefill), mean(c.decode),
                   res.utilization, res.trajectories, res.turns)


@dataclass(slots=True)
class Line:
    name: str
    real: float
    sim: float

    @property
    def error_pct(self) -> float:
        if not self.real:
            return 0.0 if not self.sim else float("inf")
        return 100 * (self.sim / self.real - 1)

    def text(self, label: str = "") -> str:
        return f"fidelity {label}{self.name} real={self.real:.4g} sim={self.sim:.4g} error={self.error_pct:+.1f}%"


def compare(real: Figures, sim: Figures) -> list[Line]:
    return [Line(f, getattr(real, f), getattr(sim, f)) for f in FIGURES]


@dataclass(slots=True)
class Runs:
    """Several runs of one configuration: the figure-wise medians."""

    real: list[Figures] = field(default_factory=list)
    sim: list[Figures] = field(default_factory=list)

    def lines(self) -> list[Line]:
        return [Line(f, median(getattr(r, f) for r in self.real), median(getattr(s, f) for s in self.sim))
                for f in FIGURES]
