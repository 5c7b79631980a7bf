"""A minimal NeMo Gym resources server, written from NeMo Gym's documented API (the package
needs Python 3.12+, so it cannot run here): `POST /seed_session` with a dataset row starts a
session (a cookie), `POST /verify` with the row and the policy's Responses object answers
`{"reward", ...}` echoing the request. This one checks the last output text against the
row's `expected_answer`, and reports `exact_match` as a metric."""

from __future__ import annotations

import uuid

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse


def create_app() -> FastAPI:
    app = FastAPI()
    app.state.sessions = {}

    @app.post("/seed_session")
    async def seed_session(request: Request, response: Response) -> dict:
        row = await request.json()
        if "expected_answer" not in row:
            return JSONResponse({"detail": "row has no expected_answer"}, status_code=422)
        sid = uuid.uuid4().hex
        app.state.sessions[sid] = row["expected_answer"]
        response.set_cookie("session_id", sid)
        return {}

    @app.post("/verify")
    async def verify(request: Request) -> dict:
        body = await request.json()
        expected = app.state.sessions.get(request.cookies.get("session_id", ""))
        if expected is None:
            return JSONResponse({"detail": "no session: call /seed_session first"}, status_code=400)
        texts = [c["text"] for item in body["response"]["output"] if item["type"] == "message"
                 for c in item["content"] if c["type"] == "output_text"]
        if texts and texts[-1] == "boom":
            raise RuntimeError("verifier bug")
        exact = bool(texts) and texts[-1].strip() == expected
        return body | {"reward": 1.0 if exact else 0.0, "exact_match": exact}

    return app
