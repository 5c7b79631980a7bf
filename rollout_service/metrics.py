"""Prometheus metrics of the gateway. Gauges are read from Redis at scrape time, so any
number of gateways report the same truth; counters of finished work live in Redis too."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from scheduler.queue import Queue
from scheduler.registry import Registry


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.queue_depth = Gauge("rollout_queue_depth", "Trajectories waiting to be claimed", registry=r)
        self.running = Gauge("rollout_trajectories_running", "Trajectories holding a lease", registry=r)
        self.finished = Gauge("rollout_trajectories_finished", "Trajectories finished, by terminal state",
                              ["state"], registry=r)
        self.failures = Gauge("rollout_failures", "Failed or cancelled trajectories, by failure kind", ["kind"],
                              registry=r)
        self.engines = Gauge("rollout_engines", "Registered engines", registry=r)
        self.workers = Gauge("rollout_env_workers", "Live env workers", registry=r)
        self.batches = Counter("rollout_batches_submitted", "Batches accepted by this gateway", registry=r)
        self.requests = Counter("rollout_http_requests", "HTTP requests by route and status",
                                ["route", "status"], registry=r)

    async def render(self, queue: Queue, registry: Registry) -> bytes:
        self.queue_depth.set(await queue.depth())
        self.running.set(await queue.running())
        stats = await queue.r.hgetall(queue.k.stats)
        for k, v in stats.items():
            k = k.decode() if isinstance(k, bytes) else k
            what, _, label = k.partition(":")
            (self.finished.labels(state=label) if what == "finished" else self.failures.labels(kind=label)).set(int(v))
        self.engines.set(len(await registry.engines()))
        self.workers.set(len(await registry.workers()))
        return generate_latest(self.registry)
