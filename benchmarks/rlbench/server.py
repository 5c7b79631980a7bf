"""The grading HTTP API, on 127.0.0.1 only. Thin routes over a started `Grader`.

    POST /submit {"model": FOLDER}  -> score, baseline, improvement, best, submission, failures, ...
    GET  /time                      -> budget_s, started_at, elapsed_s, remaining_s, spent
    GET  /health                    -> run, task, level, baseline, best, submissions, busy

Errors are the gateway's shape, `{"error": {"code", "message", "details"}}`
(`rollout_service.errors`): 404 model_not_found, 422 not_a_model / invalid_request,
403 budget_spent, 429 overloaded, 503 evaluation_failed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field

from benchmarks.rlbench.grader import Grader
from rollout_service import errors


class Submit(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: str = Field(min_length=1, max_length=4096, description="A model folder; relative to the workspace.")


def create_app(grader: Grader) -> FastAPI:
    app = FastAPI(title="rlbench grader", description="Scores model folders on hidden test tasks.")
    errors.install(app)

    @app.get("/health")
    async def health() -> dict:
        run = grader.run
        return {"status": "ok", "run": run.run, "task": run.task, "level": run.level, "baseline": run.baseline,
                "best": grader.best, "submissions": grader.count, "busy": grader.busy}

    @app.get("/time")
    async def time_left() -> dict:
        b = grader.time()
        return {"budget_s": b.budget_s, "started_at": b.started_at, "elapsed_s": round(b.elapsed_s, 3),
                "remaining_s": round(b.remaining_s, 3), "spent": b.spent}

    @app.post("/submit")
    async def submit(body: Submit) -> dict:
        rec = await grader.submit(body.model)
        return {"submission": rec.n, "model": rec.model, "score": rec.score, "baseline": grader.run.baseline,
                "improvement": rec.improvement, "best": rec.best, "n_tasks": rec.n_tasks, "usable": rec.usable,
                "truncated": rec.truncated, "failures": rec.failures, "eval_s": rec.eval_s, "t_s": rec.t_s,
                "remaining_s": round(grader.time().remaining_s, 3)}

    return app


def serve(grader: Grader, port: int, ready: Callable[[], None] = lambda: None) -> None:
    """Serve until SIGINT/SIGTERM; `ready()` runs once the port accepts connections."""
    import uvicorn

    # Loopback only: the agent shares this machine; nothing else should reach the grader.
    server = uvicorn.Server(uvicorn.Config(create_app(grader), host="127.0.0.1", port=port, log_level="warning"))

    async def main() -> None:
        async def announce() -> None:
            while not server.started:  # ends with the server: a failed bind exits serve()
                await asyncio.sleep(0.05)
            ready()

        task = asyncio.create_task(announce())
        try:
            await server.serve()
        finally:
            task.cancel()

    asyncio.run(main())
