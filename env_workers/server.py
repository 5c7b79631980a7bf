"""The env worker: hosts environment sessions behind HTTP.

    POST   /v1/sessions                 {env, task, seed}  -> {session_id, observation, info}
    POST   /v1/sessions/{id}/step       {action}           -> {observation, reward, terminated, truncated, info}
    DELETE /v1/sessions/{id}
    GET    /v1/envs, /healthz

Sessions are bounded (`max_sessions`, then 429) and an idle session is closed after
`idle_s`. When given a Redis, the worker registers itself and heartbeats, so rollout
workers find it; a worker that stops heartbeating drops out of rotation.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass, field

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from env_workers import registry
from env_workers.env import Env, EnvError
from rollout_service import errors
from rollout_service.errors import ApiError, NotFound, Overloaded
from rollout_service.protocol import EnvAction, EnvOpen, EnvOpened, EnvStepped, WorkerInfo


@dataclass(slots=True)
class Session:
    env: Env
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)


class EnvError422(ApiError):
    status, code = 422, "env_error"


def create_app(max_sessions: int = 1024, idle_s: float = 600.0, registration=None) -> FastAPI:
    """`registration`: optional (redis, keys, WorkerInfo) to announce this worker."""
    sessions: dict[str, Session] = {}

    async def reap_idle() -> None:
        while True:
            await asyncio.sleep(min(idle_s, 30.0))
            now = time.monotonic()
            for sid in [s for s, v in sessions.items() if now - v.last_used > idle_s]:
                sess = sessions.pop(sid, None)
                if sess:
                    await run_in_threadpool(sess.env.close)

    async def heartbeat() -> None:
        r, keys, info = registration
        while True:
            await r.hset(keys.workers, info.id, info.model_dump_json())
            await r.set(keys.worker_alive(info.id), "1", ex=10)
            await asyncio.sleep(3.0)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        tasks = [asyncio.create_task(reap_idle())]
        if registration is not None:
            tasks.append(asyncio.create_task(heartbeat()))
        yield
        for t in tasks:
            t.cancel()
        if registration is not None:
            r, keys, info = registration
            with contextlib.suppress(Exception):
                await r.hdel(keys.workers, info.id)
                await r.delete(keys.worker_alive(info.id))
        for sess in sessions.values():
            sess.env.close()

    app = FastAPI(title="rollout-service env worker", lifespan=lifespan)
    errors.install(app)

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"ok": True, "sessions": len(sessions)}

    @app.get("/v1/envs")
    async def envs() -> dict:
        return {"envs": [{"name": n, "description": registry.spec(n).description} for n in registry.names()]}

    @app.post("/v1/sessions", response_model=EnvOpened)
    async def open_session(body: EnvOpen) -> EnvOpened:
        if body.env not in registry.names():
            raise NotFound(f"unknown environment {body.env!r}", {"known": registry.names()})
        if len(sessions) >= max_sessions:
            raise Overloaded(f"env worker at its limit of {max_sessions} sessions")
        env = registry.make(body.env)
        try:
            obs, info = await run_in_threadpool(env.reset, body.task, body.seed)
        except EnvError as e:
            raise EnvError422(str(e)) from e
        sid = uuid.uuid4().hex
        sessions[sid] = Session(env)
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
            except EnvError as e:
                raise EnvError422(str(e)) from e
        return EnvStepped(observation=r.observation, reward=r.reward, terminated=r.terminated,
                          truncated=r.truncated, info=r.info)

    @app.delete("/v1/sessions/{sid}")
    async def close(sid: str) -> dict:
        sess = sessions.pop(sid, None)
        if sess is None:
            raise NotFound(f"no session {sid!r}")
        await run_in_threadpool(sess.env.close)
        return {"closed": sid}

    return app


def serve(host: str, port: int, redis_url: str | None, prefix: str, worker_id: str | None = None,
          advertise: str | None = None) -> None:
    import uvicorn

    registration = None
    if redis_url:
        import redis.asyncio as aioredis

        from scheduler.keys import Keys

        info = WorkerInfo(id=worker_id or f"env-{host}-{port}", url=advertise or f"http://{host}:{port}",
                          envs=registry.names())
        registration = (aioredis.from_url(redis_url), Keys(prefix), info)
    uvicorn.run(create_app(registration=registration), host=host, port=port, log_level="warning")
