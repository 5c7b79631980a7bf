"""The env worker: hosts environment sessions behind HTTP.

    POST   /v1/sessions                 {env, task, seed}  -> {session_id, observation, info}
    POST   /v1/sessions/{id}/step       {action}           -> {observation, reward, terminated, truncated, info}
    DELETE /v1/sessions/{id}
    GET    /v1/envs, /healthz

Sessions are bounded (`max_sessions`, then 429) and an idle session is closed after
`idle_s`. The worker owns the resource pools (`scheduler/resources.py`): it pre-warms the
pools its environments declare, hands each session a `Claims` under the session's id, and
releases whatever the session still holds when it is deleted or expires. A sandbox that
could not be had answers 503 `sandbox_unavailable` (another infrastructure trouble of the
environment: 503 `env_unavailable`); the client raises `SandboxUnavailable`/`EnvUnavailable`.

When given a Redis, the worker registers itself and heartbeats, so rollout workers find it;
a worker that stops heartbeating drops out of rotation. The heartbeat rides out Redis
outages (bounded back-off; the registration is written again on every beat, so a restarted
or flushed Redis has it back within one beat). `/healthz` reports each background loop; if
one ever ends, `/healthz` answers 503 and the process stops with exit status 1, so its
supervisor (`rollout up`, compose, Kubernetes) restarts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
import uuid
from dataclasses import dataclass, field

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from env_workers import registry
from env_workers.env import Env, EnvError, EnvUnavailable, SandboxUnavailable
from env_workers.envs import judge
from rollout_service import errors
from rollout_service.errors import ApiError, NotFound, Overloaded
from rollout_service.protocol import EnvAction, EnvOpen, EnvOpened, EnvStepped, WorkerInfo
from scheduler.connection import UNAVAILABLE, Backoff
from scheduler.resources import PoolSize, Pools

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Session:
    id: str
    env: Env
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)


class EnvError422(ApiError):
    status, code = 422, "env_error"


class EnvUnavailable503(ApiError):
    status, code = 503, "env_unavailable"


class SandboxUnavailable503(ApiError):
    status, code = 503, "sandbox_unavailable"


def _api_error(e: Exception) -> ApiError:
    if isinstance(e, SandboxUnavailable):
        return SandboxUnavailable503(str(e))
    if isinstance(e, EnvUnavailable):
        return EnvUnavailable503(str(e))
    return EnvError422(str(e))


# Each env worker keeps a couple of sandboxes per declared spec warm and at most 64 alive;
# a tool call waits at most 30 s for one (then the episode fails with kind `sandbox`).
DEFAULT_POOL = PoolSize(warm=2, cap=64, wait_s=30.0)


def create_app(max_sessions: int = 1024, idle_s: float = 600.0, registration=None, pools: Pools | None = None,
               pool_size: PoolSize = DEFAULT_POOL, on_fatal=None) -> FastAPI:
    """`registration`: optional (redis, keys, WorkerInfo) to announce this worker. `pools`:
    resource pools to use (and leave open); by default the app owns its own, sized `pool_size`.
    `on_fatal`: called once a background loop has died (`serve` passes one that stops the server)."""
    sessions: dict[str, Session] = {}
    owned = pools is None
    pools = pools if pools is not None else Pools(pool_size)

    def close_session(sess: Session) -> None:
        try:
            sess.env.close()
        except Exception:  # noqa: BLE001 - the resources must be released anyway
            log.exception("closing session %s", sess.id)
        try:
            pools.release(sess.id)
        except Exception:  # noqa: BLE001
            log.exception("releasing the resources of session %s", sess.id)

    async def reap_idle() -> None:
        while True:
            await asyncio.sleep(min(idle_s, 30.0))
            now = time.monotonic()
            # A session in the middle of a step is not idle, however long the step takes.
            for sid in [s for s, v in sessions.items() if now - v.last_used > idle_s and not v.lock.locked()]:
                sess = sessions.pop(sid, None)
                if sess:
                    await run_in_threadpool(close_session, sess)

    async def beat_once() -> None:
        r, keys, info = registration
        use: dict[str, int] = {}  # pool use by resource kind, for the gateway's /metrics
        for name, st in pools.stats().items():
            for state, n in st.items():
                key = f"{name.split(':', 1)[0]}:{state}"
                use[key] = use.get(key, 0) + n
        pipe = r.pipeline(transaction=False)
        pipe.hset(keys.workers, info.id, info.model_dump_json())
        pipe.set(keys.worker_alive(info.id), "1", ex=10)
        pipe.delete(keys.worker_pools(info.id))
        if use:
            pipe.hset(keys.worker_pools(info.id), mapping=use)
        pipe.expire(keys.worker_pools(info.id), 10)
        await pipe.execute()

    async def heartbeat() -> None:
        backoff = Backoff(cap_s=2.0)
        while True:
            try:
                await beat_once()
            except UNAVAILABLE as e:  # Redis restarting: try again soon, well inside the 10 s TTL
                loops["heartbeat"] = f"retrying: {e!r}"[:200]
                log.warning("heartbeat failed: Redis unavailable (%r)", e)
                await backoff.wait()
                continue
            loops["heartbeat"] = "ok"
            backoff.reset()
            await asyncio.sleep(3.0)

    def watch(name: str, task: asyncio.Task) -> None:
        """A background loop that ends is fatal: report it, then stop the process (exit 1)."""
        def done(t: asyncio.Task) -> None:
            if t.cancelled() and stopping:
                return
            why = "cancelled" if t.cancelled() else repr(t.exception())
            loops[name] = f"died: {why}"
            log.error("background loop %s died (%s); stopping so the supervisor restarts this worker", name, why)
            app.state.fatal = True
            if on_fatal is not None:
                on_fatal()
        task.add_done_callback(done)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        for name in registry.names():
            for rs in registry.spec(name).resources:
                pools.prewarm(rs)
        nonlocal stopping
        tasks = {"reaper": asyncio.create_task(reap_idle())}
        if registration is not None:
            tasks["heartbeat"] = asyncio.create_task(heartbeat())
        for name, t in tasks.items():
            loops[name] = "starting"
            watch(name, t)
        yield
        stopping = True
        for t in tasks.values():
            t.cancel()
        if registration is not None:
            r, keys, info = registration
            with contextlib.suppress(Exception):
                await r.hdel(keys.workers, info.id)
                await r.delete(keys.worker_alive(info.id))
        for sess in list(sessions.values()):
            await run_in_threadpool(close_session, sess)
        sessions.clear()
        if owned:
            await run_in_threadpool(pools.close)

    loops: dict[str, str] = {}  # background loop -> its state, for /healthz
    stopping = False
    app = FastAPI(title="rollout-service env worker", lifespan=lifespan)
    app.state.fatal = False
    errors.install(app)

    @app.get("/healthz")
    async def healthz():
        ok = not any(v.startswith("died") for v in loops.values())
        body = {"ok": ok, "loops": dict(loops), "sessions": len(sessions), "resources": pools.stats()}
        return body if ok else JSONResponse(body, status_code=503)

    @app.get("/v1/envs")
    async def envs() -> dict:
        return {"envs": [{"name": n, "description": registry.spec(n).description} for n in registry.names()]}

    @app.post("/v1/sessions", response_model=EnvOpened)
    async def open_session(body: EnvOpen) -> EnvOpened:
        if body.env not in registry.names():
            raise NotFound(f"unknown environment {body.env!r}", {"known": registry.names()})
        if len(sessions) >= max_sessions:
            raise Overloaded(f"env worker at its limit of {max_sessions} sessions")
        sid = uuid.uuid4().hex
        sess = Session(sid, registry.make(body.env, resources=pools.claims(sid)))
        try:
            obs, info = await run_in_threadpool(sess.env.reset, body.task, body.seed)
        except (EnvError, EnvUnavailable) as e:
            await run_in_threadpool(close_session, sess)
            raise _api_error(e) from e
        sessions[sid] = sess
        return EnvOpened(session_id=sid, observation=obs, info=info)

    @app.post("/v1/sessions/{sid}/step", response_model=EnvStepped)
    async def step(sid: str, body: EnvAction) -> EnvStepped:
        sess = sessions.get(sid)
        if sess is None:
            raise NotFound(f"no session {sid!r}")
        async with sess.lock:
            sess.last_used = time.monotonic()
            try:
                r = await run_in_threadpool(sess.env.step, body.action)
            except (EnvError, EnvUnavailable) as e:
                raise _api_error(e) from e
            finally:
                sess.last_used = time.monotonic()
        return EnvStepped(observation=r.observation, reward=r.reward, terminated=r.terminated,
                          truncated=r.truncated, info=r.info)

    @app.delete("/v1/sessions/{sid}")
    async def close(sid: str) -> dict:
        sess = sessions.pop(sid, None)
        if sess is None:
            raise NotFound(f"no session {sid!r}")
        await run_in_threadpool(close_session, sess)
        return {"closed": sid}

    return app


def serve(host: str, port: int, redis_url: str | None, prefix: str, worker_id: str | None = None,
          advertise: str | None = None, pool_size: PoolSize = DEFAULT_POOL, judge_prefix: str | None = None) -> None:
    """`judge_prefix`: the registry (Redis key prefix) whose engines the `judge` env asks;
    default the service's own. A separate one pins the judge to engines that training never
    updates (the model under training must not grade itself)."""
    import uvicorn

    registration = None
    if redis_url:
        from scheduler.connection import connect
        from scheduler.keys import Keys

        info = WorkerInfo(id=worker_id or f"env-{host}-{port}", url=advertise or f"http://{host}:{port}",
                          envs=registry.names())
        registration = (connect(redis_url), Keys(prefix), info)
        judge.configure(judge.EngineJudge(redis_url, judge_prefix or prefix))  # the `judge` env asks the fleet
    server: uvicorn.Server | None = None

    def stop() -> None:  # a clean shutdown, then the exit status below
        server.should_exit = True

    app = create_app(registration=registration, pool_size=pool_size, on_fatal=stop)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    server.run()
    if app.state.fatal:
        sys.exit(1)  # a background loop died: a non-zero exit gets this worker restarted
