"""Prometheus metrics of the gateway. Everything is read from Redis at scrape time, so any
number of gateways report the same truth; counters of finished work live in Redis too.

    rollout_queue_depth, rollout_trajectories_running          gauges
    rollout_trajectories_finished_total{state}                  counter
    rollout_failures_total{kind}                                counter
    rollout_tokens_total{kind="sampled"|"prompt"}               counter (rate() = tokens/s)
    rollout_turn_prefill_seconds                                histogram: time to first token per turn
    rollout_engine_inflight_tokens{engine,role}, rollout_engine_up{engine,role}
    rollout_trajectory_phase{phase}, rollout_forecast_tokens{kind="prefill_tokens"|"decode_tokens"}
    rollout_resource_pool{kind,state}                             env workers' sandbox pools
    rollout_env_workers, rollout_batches_submitted_total, rollout_http_requests_total{route,status}
    rollout_trajectory_restarts_total                           episodes restarted after our fault (uncharged)
    rollout_trajectory_retries_total                            retryable failures charged to trajectories
    rollout_component_restarts_total{component}                 processes `rollout up` restarted
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from scheduler.queue import PREFILL_BUCKETS_S, PREFILL_KEYS, Queue
from scheduler.registry import Registry


@dataclass(slots=True)
class Snapshot:
    depth: int = 0
    running: int = 0
    stats: dict[str, int] = field(default_factory=dict)
    engines: list[tuple[str, str, int, bool]] = field(default_factory=list)  # id, role, in-flight, up
    workers: int = 0
    phases: dict[str, int] = field(default_factory=dict)  # phase:{name} and forecast:{kind}, all workers
    pools: dict[str, int] = field(default_factory=dict)  # {kind}:{state} over env workers
    components: dict[str, int] = field(default_factory=dict)  # component -> supervisor restarts


class _RedisCollector:
    def __init__(self) -> None:
        self.snap = Snapshot()

    def collect(self):
        s = self.snap
        yield GaugeMetricFamily("rollout_queue_depth", "Trajectories queued: ready to claim or backing off before a retry",
                                value=s.depth)
        yield GaugeMetricFamily("rollout_trajectories_running", "Trajectories holding a lease", value=s.running)
        fams = {
            "finished": CounterMetricFamily("rollout_trajectories_finished", "Trajectories finished, by state",
                                            labels=["state"]),
            "failure": CounterMetricFamily("rollout_failures", "Failed or cancelled trajectories, by kind",
                                           labels=["kind"]),
            "tokens": CounterMetricFamily("rollout_tokens", "Tokens in finished trajectories", labels=["kind"]),
        }
        for key, n in sorted(s.stats.items()):
            what, _, label = key.partition(":")
            if what in fams:
                fams[what].add_metric([label], n)
        yield from fams.values()
        cumulative, buckets = 0, []
        for bound, key in zip((*PREFILL_BUCKETS_S, "+Inf"), PREFILL_KEYS):
            cumulative += s.stats.get(key, 0)
            buckets.append((str(bound), cumulative))
        yield HistogramMetricFamily("rollout_turn_prefill_seconds", "Time to first token of each turn of "
                                    "finished trajectories", buckets=buckets,
                                    sum_value=s.stats.get("prefill_sum_us", 0) / 1e6)
        yield CounterMetricFamily("rollout_trajectory_restarts", "Episodes restarted because a peer was lost "
                                  "(engine, env worker, rollout worker or Redis); never charged",
                                  value=s.stats.get("restarts", 0))
        yield CounterMetricFamily("rollout_trajectory_retries", "Retryable failures charged to trajectories",
                                  value=s.stats.get("attempts", 0))
        comp = CounterMetricFamily("rollout_component_restarts", "Processes restarted by their supervisor",
                                   labels=["component"])
        for name, n in sorted(s.components.items()):
            comp.add_metric([name], n)
        yield comp
        inflight = GaugeMetricFamily("rollout_engine_inflight_tokens", "In-flight tokens per engine (all workers)",
                                     labels=["engine", "role"])
        up = GaugeMetricFamily("rollout_engine_up", "1 unless a worker's probe finds the engine down",
                               labels=["engine", "role"])
        for eid, role, tokens, ok in s.engines:
            inflight.add_metric([eid, role], tokens)
            up.add_metric([eid, role], 1 if ok else 0)
        yield inflight
        yield up
        yield GaugeMetricFamily("rollout_engines", "Registered engines", value=len(s.engines))
        phase = GaugeMetricFamily("rollout_trajectory_phase", "Live trajectories by lifecycle phase",
                                  labels=["phase"])
        forecast = GaugeMetricFamily("rollout_forecast_tokens", "Forecast engine demand over the next seconds",
                                     labels=["kind"])
        for key, n in sorted(s.phases.items()):
            what, _, label = key.partition(":")
            (phase if what == "phase" else forecast).add_metric([label], n)
        yield phase
        yield forecast
        pool = GaugeMetricFamily("rollout_resource_pool", "Env workers' resource pools (sandboxes, ...) by state",
                                 labels=["kind", "state"])
        for key, n in sorted(s.pools.items()):
            kind, _, state = key.partition(":")
            pool.add_metric([kind, state], n)
        yield pool
        yield GaugeMetricFamily("rollout_env_workers", "Live env workers", value=s.workers)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._redis = _RedisCollector()
        self.registry.register(self._redis)
        self.batches = Counter("rollout_batches_submitted", "Batches accepted by this gateway", registry=self.registry)
        self.requests = Counter("rollout_http_requests", "HTTP requests by route and status",
                                ["route", "status"], registry=self.registry)

    async def snapshot(self, queue: Queue, registry: Registry) -> Snapshot:
        stats = {(k.decode() if isinstance(k, bytes) else k): int(v)
                 for k, v in (await queue.r.hgetall(queue.k.stats)).items()}
        engines = await registry.engines()
        loads = await registry.engine_loads([e.id for e in engines])
        return Snapshot(depth=await queue.depth(), running=await queue.running(), stats=stats,
                        engines=[(e.id, e.role if e.state == "ready" else e.state, *loads[e.id]) for e in engines],
                        workers=len(await registry.workers()), phases=await registry.phases(),
                        pools=await registry.pools(),
                        components={(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in
                                    (await queue.r.hgetall(queue.k.component_restarts)).items()})

    async def render(self, queue: Queue, registry: Registry) -> bytes:
        self._redis.snap = await self.snapshot(queue, registry)
        return generate_latest(self.registry)
