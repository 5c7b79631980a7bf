"""The env worker: hosts environment sessions behind HTTP.

    POST   /v1/sessions                 {env, task, seed}  -> {session_id, observation, info}
    POST   /v1/sessions/{id}/step       {action}           -> {observation, reward, terminated, truncated, info}
    DELETE /v1/sessions/{id}
    GET    /v1/envs, /healthz

Sessions are bounded (`max_sessions`, then 429) and an idle session is closed after
`idle_s`. The worker owns the resource pools (`env_workers/resources.py`): it pre-warms the
pools its environments declare, hands each session a `Claims` owned by the session's
trajectory (`EnvOpen.trajectory_id`, so a sandbox lease names the trajectory everyone else
knows), and releases whatever the session still holds when it is deleted or expires. A new
session for a trajectory that still has one here (a restarted attempt) closes the old one. A sandbox that
could not be had answers 503 `sandbox_unavailable` (another infrastructure trouble of the
environment: 503 `env_unavailable`); the client raises `SandboxUnavailable`/`EnvUnavailable`.
An exception of any other type from an environment's own code (a third-party package's bug,
say) answers 502 `env_crashed` with its type and message: an `env` failure, never a 500.
A name that gives no environment answers 404 `not_found` (unknown name or family), 422
`env_package_missing` (its family's package is not installed here) or 422 `env_unadaptable`.

When given a `Registrar` (the service passes `scheduler.registry.Registry`: the one place
that knows the keys), the worker announces itself and heartbeats, so rollout workers find
it; a worker that stops heartbeating drops out of rotation. The heartbeat rides out outages
of the registry (bounded back-off on the registrar's `unavailable` errors; the whole
announcement is written again on every beat, so a restarted or flushed Redis has it back
within one beat). `/healthz` reports each background loop; if
one ever ends, `/healthz` answers 503 and the process stops with exit status 1, so its
supervisor (`rollout up`, compose, Kubernetes) restarts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Protocol

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from env_workers import adapters, registry
from env_workers.env import Env, EnvError, EnvUnavailable, SandboxUnavailable, checked_step
from env_workers.registry import EnvPackageMissing, EnvUnadaptable, UnknownEnv
from env_workers.resources import Pools, PoolSize
from wire.envs import EnvAction, EnvOpen, EnvOpened, EnvStepped, WorkerInfo
from wire.errors import ApiError, NotFound, Overloaded, error_body

log = logging.getLogger(__name__)


class Registrar(Protocol):
    """Where an env worker announces itself. One narrow interface, so that one place (the
    service's `scheduler.registry.Registry`) knows how announcements are stored."""

    unavailable: tuple[type[BaseException], ...]  # errors meaning "the registry is away: try again soon"

    async def announce_worker(self, info: WorkerInfo, pools: dict[str, int], ttl_s: int) -> None:
        """Register (or refresh) this worker and its pool use, alive for `ttl_s`."""

    async def withdraw_worker(self, worker_id: str) -> None: ...


@dataclass(slots=True)
class Session:
    id: str
    owner: str  # the trajectory this episode belongs to: owner of its resource leases
    env: Env
    inline: bool = False  # `EnvSpec.inline`: its calls run on the event loop, not in a thread
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)


async def _call(inline: bool, fn, *args):
    """`fn(*args)` on the event loop for an env whose calls are microseconds of computation
    (`EnvSpec.inline`: a thread handoff costs more than the call), else in a thread."""
    return fn(*args) if inline else await run_in_threadpool(fn, *args)


class EnvRejected422(ApiError):
    """The environment refused the task or action (`EnvError`): the client raises `EnvRejected`."""

    status, code = 422, "env_error"


class EnvUnavailable503(ApiError):
    status, code = 503, "env_unavailable"


class SandboxUnavailable503(ApiError):
    status, code = 503, "sandbox_unavailable"


class EnvCrashed502(ApiError):
    """The environment's own code raised something that is not part of our protocol."""

    status, code = 502, "env_crashed"


def _api_error(e: Exception) -> ApiError:
    if isinstance(e, SandboxUnavailable):
        return SandboxUnavailable503(str(e))
    if isinstance(e, EnvUnavailable):
        return EnvUnavailable503(str(e))
    if isinstance(e, EnvError):
        return EnvRejected422(str(e))
    log.warning("environment raised %s", type(e).__name__, exc_info=e)
    return EnvCrashed502(f"the environment raised {type(e).__name__}: {e}"[:2000])


def _spec_error(e: Exception) -> ApiError:
    if isinstance(e, UnknownEnv):
        return NotFound(str(e))
    code = "env_package_missing" if isinstance(e, EnvPackageMissing) else "env_unadaptable"
    return ApiError(str(e), status=422, code=code)


# Each env worker keeps a couple of sandboxes per declared spec warm and at most 64 alive;
# a tool call waits at most 30 s for one (then the episode fails with kind `sandbox`).
DEFAULT_POOL = PoolSize(warm=2, cap=64, wait_s=30.0)


def _install_errors(app: FastAPI) -> None:
    """Every answer that is not a 200 in the one error shape (`wire.errors`)."""

    @app.exception_handler(ApiError)
    async def _api(_req, exc: ApiError):
        return JSONResponse(error_body(exc.code, exc.message, exc.details), status_code=exc.status,
                            headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_req, exc: RequestValidationError):
        details = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
                   for e in exc.errors()]
        return JSONResponse(error_body("invalid_request", "request failed validation", details), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_req, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return JSONResponse(error_body(code, str(exc.detail)), status_code=exc.status_code,
                            headers=dict(getattr(exc, "headers", None) or {}))

    @app.exception_handler(Exception)
    async def _unexpected(_req, exc: Exception):
        log.exception("unhandled error")
        return JSONResponse(error_body("internal", "internal error"), status_code=500)


def create_app(max_sessions: int = 1024, idle_s: float = 600.0,
               registration: tuple[Registrar, WorkerInfo] | None = None, pools: Pools | None = None,
               pool_size: PoolSize = DEFAULT_POOL, on_fatal=None) -> FastAPI:
    """`registration`: optional (registrar, WorkerInfo) to announce this worker. `pools`:
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
            pools.release(sess.owner)
        except Exception:  # noqa: BLE001
            log.exception("releasing the resources of session %s", sess.id)
        if owners.get(sess.owner) == sess.id:
            del owners[sess.owner]

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
        registrar, info = registration
        use: dict[str, int] = {}  # pool use by resource kind, for the gateway's /metrics
        for name, st in pools.stats().items():
            for state, n in st.items():
                key = f"{name.split(':', 1)[0]}:{state}"
                use[key] = use.get(key, 0) + n
        await registrar.announce_worker(info, use, ttl_s=10)

    async def heartbeat() -> None:
        failures = 0
        while True:
            try:
                await beat_once()
            except registration[0].unavailable as e:  # Redis restarting: try again soon, well inside the 10 s TTL
                loops["heartbeat"] = f"retrying: {e!r}"[:200]
                log.warning("heartbeat failed: registry unavailable (%r)", e)
                failures += 1  # bounded, jittered back-off: 0.1 s doubling to 2 s
                await asyncio.sleep(min(2.0, 0.1 * 2 ** min(failures - 1, 16)) * random.uniform(0.5, 1.0))
                continue
            loops["heartbeat"] = "ok"
            failures = 0
            # scheduler.connection.cancel_point, inline (env workers import nothing of the scheduler):
            # a cancel the Redis client dropped (Python 3.11's wait_for) still ends this loop.
            if asyncio.current_task().cancelling():
                raise asyncio.CancelledError
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
            registrar, info = registration
            with contextlib.suppress(Exception):
                await registrar.withdraw_worker(info.id)
        for sess in list(sessions.values()):
            await run_in_threadpool(close_session, sess)
        sessions.clear()
        if owned:
            await run_in_threadpool(pools.close)

    loops: dict[str, str] = {}  # background loop -> its state, for /healthz
    owners: dict[str, str] = {}  # trajectory id -> its open session here
    stopping = False
    app = FastAPI(title="rollout-service env worker", lifespan=lifespan)
    app.state.fatal = False
    _install_errors(app)

    @app.get("/healthz")
    async def healthz():
        ok = not any(v.startswith("died") for v in loops.values())
        body = {"ok": ok, "loops": dict(loops), "sessions": len(sessions), "resources": pools.stats()}
        return body if ok else JSONResponse(body, status_code=503)

    @app.get("/v1/envs")
    async def envs() -> dict:
        return {"envs": [{"name": n, "description": registry.spec(n).description} for n in registry.names()],
                "families": [{"name": f"{f}:*", "description": adapters.FAMILIES[f].description,
                              "package": adapters.FAMILIES[f].dist, "version": adapters.version(f)}
                             for f in adapters.installed()]}

    @app.get("/v1/envs/{name:path}")
    async def env(name: str) -> dict:
        """Whether this worker can run `name` (a `FAMILY:NAME` resolved, its package imported on
        first use, as opening a session would): what the gateway asks before queueing a batch."""
        try:
            spec = await _call(":" not in name, registry.spec, name)
        except (UnknownEnv, EnvPackageMissing, EnvUnadaptable) as e:
            raise _spec_error(e) from e
        except Exception as e:  # noqa: BLE001 - the third party's own code failed while loading
            raise _api_error(e) from e
        return {"name": spec.name, "description": spec.description}

    @app.post("/v1/sessions", response_model=EnvOpened)
    async def open_session(body: EnvOpen) -> EnvOpened:
        if len(sessions) >= max_sessions:
            raise Overloaded(f"env worker at its limit of {max_sessions} sessions")
        try:  # a third-party name imports its package and may ask its server: off the event loop
            spec = await _call(":" not in body.env, registry.spec, body.env)  # a built-in: a lookup
        except (UnknownEnv, EnvPackageMissing, EnvUnadaptable) as e:
            raise _spec_error(e) from e
        except Exception as e:  # noqa: BLE001 - the third party's own code failed while loading
            raise _api_error(e) from e
        sid = uuid.uuid4().hex
        owner = body.trajectory_id or sid
        stale = sessions.pop(owners.get(owner, ""), None)
        if stale is not None:  # an earlier attempt of this trajectory: its lease is gone, and so is its episode
            await run_in_threadpool(close_session, stale)
        inline = spec.inline
        try:
            env = await _call(inline, registry.make, body.env, pools.claims(owner))
        except Exception as e:  # noqa: BLE001 - a third-party constructor: its failure is the env's
            await run_in_threadpool(pools.release, owner)
            raise _api_error(e) from e
        sess = Session(sid, owner, env, inline)
        try:
            obs, info = await _call(inline, sess.env.reset, body.task, body.seed)
        except Exception as e:  # noqa: BLE001 - every failure of the env's own code is an answer, not a 500
            await _call(inline, close_session, sess)
            raise _api_error(e) from e
        sessions[sid] = sess
        owners[owner] = sid
        return EnvOpened(session_id=sid, observation=obs, info=info)

    @app.post("/v1/sessions/{sid}/step", response_model=EnvStepped)
    async def step(sid: str, body: EnvAction) -> EnvStepped:
        sess = sessions.get(sid)
        if sess is None:
            raise NotFound(f"no session {sid!r}")
        async with sess.lock:
            sess.last_used = time.monotonic()
            try:
                r = checked_step(await _call(sess.inline, sess.env.step, body.action))
            except Exception as e:  # noqa: BLE001 - as in open_session
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
        await _call(sess.inline, close_session, sess)
        return {"closed": sid}

    return app


def serve(host: str, port: int, registrar: Registrar | None = None, worker_id: str | None = None,
          advertise: str | None = None, pool_size: PoolSize = DEFAULT_POOL) -> None:
    """Run an env worker until stopped. `registrar`: where to announce it (none: not announced,
    its URL is given to rollout workers some other way)."""
    import uvicorn

    registration = None
    if registrar is not None:
        info = WorkerInfo(id=worker_id or f"env-{host}-{port}", url=advertise or f"http://{host}:{port}",
                          envs=registry.hosted())
        registration = (registrar, info)
    server: uvicorn.Server | None = None

    def stop() -> None:  # a clean shutdown, then the exit status below
        server.should_exit = True

    app = create_app(registration=registration, pool_size=pool_size, on_fatal=stop)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    server.run()
    if app.state.fatal:
        sys.exit(1)  # a background loop died: a non-zero exit gets this worker restarted
