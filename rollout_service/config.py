"""Settings, read once per process at the edge (environment variables `ROLLOUT_*`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

DEFAULT_PORT = 8000  # the gateway's


@dataclass(slots=True)
class Settings:
    redis_url: str = "redis://127.0.0.1:6379/0"  # or redis+sentinel://host:port[,host:port]/service[/db]
    redis_wait_replicas: int = -1  # replicas a submitted batch must reach before 202; -1: 1 behind Sentinel, else 0
    key_prefix: str = "rs:"
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    lease_s: float = 30.0  # a worker heartbeats every lease_s/3; a dead worker's work returns after lease_s
    max_attempts: int = 3  # per trajectory, counting the first
    max_restarts: int = 20  # episodes lost to our faults (a peer died, Redis away): uncharged; stops poison work
    worker_concurrency: int = 32  # trajectories in flight per worker process
    routing: str = "role_aware"  # routing policy (scheduler.router.POLICIES): role_aware | sticky
    max_request_bytes: int = 32 * 1024 * 1024
    max_trajectories_per_batch: int = 10_000  # tasks × group_size of one request
    max_task_bytes: int = 64 * 1024  # one task's JSON; Redis stores it once per trajectory, so × group_size
    max_open_per_tenant: int = 50_000  # a tenant's trajectories queued or running at once (0: no cap); then 429
    max_running_per_tenant: int = 0  # a tenant's trajectories running at once (0: no cap); the rest wait queued
    tenant_weights: str = ""  # fair-share weights, "teamA=3,teamB=1"; unnamed tenants weigh 1
    longest_first: bool = False  # rank a tenant's batches (same priority) by expected episode time, longest first
    sse_block_ms: int = 1000
    result_store: str = "redis"  # where finished trajectories live: redis (inline) | file:///DIR (scheduler.results)
    # Finished batches (results, events, counts) are deleted this long after they finish; 0 keeps
    # them forever. A week: trainers read results within minutes, `rollout export` within days.
    result_retention_s: float = 7 * 86_400
    retention_sweep_s: float = 60.0  # how often each gateway looks for expired batches
    sandbox_warm: int = 2  # env worker: idle sandboxes kept ready per spec
    sandbox_cap: int = 64  # env worker: most sandboxes of one spec alive at once
    sandbox_wait_s: float = 30.0  # env worker: longest wait for a sandbox at the cap, then a clear error
    sandbox_backend: str = "bwrap"  # env worker: env_workers.sandbox.backends.BACKENDS, for specs naming none
    sandbox_docker_url: str = ""  # docker backend: Docker API URL ("" = the environment's DOCKER_HOST or socket)
    sandbox_image: str = ""  # docker backend: the image every sandbox container runs
    auth: bool = False  # on by itself when admin_key is set
    admin_key: str = ""  # bootstrap admin key, registered (hashed) at gateway start

    @classmethod
    def from_env(cls, **overrides) -> "Settings":
        values = {}
        for f in fields(cls):
            raw = os.environ.get(f"ROLLOUT_{f.name.upper()}")
            if raw is not None:
                kind = type(f.default)
                values[f.name] = raw.strip().lower() in ("1", "true", "yes", "on") if kind is bool else kind(raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def tenant_weight(self, tenant: str) -> float:
        """This tenant's fair-share weight from `tenant_weights` (1 when unnamed); ValueError
        on a malformed setting, which `create_app` calls at start so it fails there."""
        for item in filter(None, (x.strip() for x in self.tenant_weights.split(","))):
            name, sep, value = item.partition("=")
            if not sep or not name.strip() or not float(value) > 0:
                raise ValueError(f"ROLLOUT_TENANT_WEIGHTS: {item!r} is not NAME=POSITIVE_NUMBER")
            if name.strip() == tenant:
                return float(value)
        return 1.0

    @property
    def wait_replicas(self) -> int:
        if self.redis_wait_replicas >= 0:
            return self.redis_wait_replicas
        from scheduler.connection import replicated
        return replicated(self.redis_url)

    @property
    def auth_enabled(self) -> bool:
        return self.auth or bool(self.admin_key)


def gateway_url() -> str:
    """The gateway a client command talks to without `--url`: `$ROLLOUT_URL`, else the default
    gateway's own address."""
    return os.environ.get("ROLLOUT_URL") or f"http://127.0.0.1:{DEFAULT_PORT}"
