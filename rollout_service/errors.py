"""The gateway's renderer of the one JSON error shape (`wire.errors`).

    ApiError(status, code)      rendered as {"error": {"code", "message", "details"}}
    ├── NotFound                404
    ├── Conflict                409
    └── Overloaded              429 (backpressure: a bounded wait ran out, a quota is full)
    (engine/env failures are data: see wire.FailureKind)

The tree itself lives in `wire.errors` (plain exceptions, no framework), so the env worker
and clients share it; this module only installs the handlers.

Redis being unreachable (down, restarting, loading its data) renders as 503
`redis_unavailable` with `Retry-After`, never as a 500: the caller may simply try again.

`install(app)` makes FastAPI render ApiError, validation errors, unknown routes and any
unexpected exception in that shape (the last as a 500 that hides internals).
"""

from __future__ import annotations

import logging

from wire.errors import ApiError
from wire.errors import error_body as body

log = logging.getLogger(__name__)


def _allowed_methods(app, path: str) -> list[str]:
    """Every method any route serves at `path` (Starlette names only the first route's)."""
    want = path.rstrip("/").split("/")
    methods: set[str] = set()
    for template, ops in app.openapi()["paths"].items():
        have = template.rstrip("/").split("/")
        if len(have) == len(want) and all(h == w or (h.startswith("{") and w) for h, w in zip(have, want)):
            methods |= {m.upper() for m in ops}
    return sorted(methods)


def _msg(e: dict) -> str:
    """A validation error's message; a body that is not JSON says why (FastAPI keeps it aside)."""
    why = (e.get("ctx") or {}).get("error") if e.get("type") == "json_invalid" else None
    return f"{e.get('msg', '')}: {why}" if why else e.get("msg", "")


def _branch(part) -> bool:
    """A union branch's label in an error's location (`function-after[...]`, `list[...]`), not a field."""
    return isinstance(part, str) and ("[" in part or "(" in part)


def install(app) -> None:  # app: fastapi.FastAPI (kept untyped: this module must not need fastapi)
    from fastapi.encoders import jsonable_encoder
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    @app.exception_handler(ApiError)
    async def _api(_req, exc: ApiError):
        return JSONResponse(body(exc.code, exc.message, exc.details), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_req, exc: RequestValidationError):
        details = [{"loc": list(e.get("loc", ())), "msg": _msg(e), "type": e.get("type", "")} for e in exc.errors()]
        # One problem in the message itself (clients, OpenAI's SDK and agents, show only that):
        # an unsupported feature first, then one that is not a mere type mismatch: a union tries
        # each branch, and `[]` for `str | list` said "Input should be a valid string".
        first = next((d for d in details if d["type"] == "unsupported"), None) or \
            next((d for d in details if not d["type"].endswith("_type")), None) or \
            (details[0] if details else {"loc": [], "msg": ""})
        where = ".".join(str(p) for p in first["loc"] if not _branch(p))
        return JSONResponse(body("invalid_request", f"request failed validation: {where}: {first['msg']}",
                                 jsonable_encoder(details)), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(req, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}.get(exc.status_code, "http_error")
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(_allowed_methods(req.app, req.url.path))
        return JSONResponse(body(code, str(exc.detail)), status_code=exc.status_code, headers=headers)

    try:
        from scheduler.connection import UNAVAILABLE
    except ImportError:  # redis not installed: nothing to map
        UNAVAILABLE = ()

    async def _redis_away(_req, exc: Exception):
        log.warning("Redis unavailable: %r", exc)
        return JSONResponse(body("redis_unavailable", "the service's Redis is unreachable; try again shortly"),
                            status_code=503, headers={"Retry-After": "2"})

    for kind in UNAVAILABLE:
        app.add_exception_handler(kind, _redis_away)

    @app.exception_handler(Exception)
    async def _unexpected(_req, exc: Exception):
        log.exception("unhandled error")
        return JSONResponse(body("internal", "internal error"), status_code=500)
