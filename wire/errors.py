"""The one error shape every HTTP endpoint answers with, and the errors that render as it.

    ApiError(status, code)      {"error": {"code", "message", "details"}}
    ├── NotFound                404
    ├── Conflict                409
    └── Overloaded              429 (backpressure: a bounded wait ran out, a quota is full)

Plain exceptions, no web framework: each server installs its own renderer
(`rollout_service.errors.install`, `env_workers.server`), clients read `ErrorResponse`.
"""

from __future__ import annotations

from typing import Any

from wire.base import Wire


class ErrorBody(Wire):
    code: str
    message: str
    details: Any = None


class ErrorResponse(Wire):
    """The one error shape every endpoint answers with."""

    error: ErrorBody


def error_body(code: str, message: str, details: Any = None) -> dict:
    """`ErrorResponse` as a plain dict (what a JSON response carries)."""
    return {"error": {"code": code, "message": message, "details": details}}


class ApiError(Exception):
    status = 400
    code = "bad_request"

    def __init__(self, message: str, details: Any = None, *, status: int | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.details = details
        self.headers = headers  # e.g. Retry-After on a 429
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code


class NotFound(ApiError):
    status, code = 404, "not_found"


class Conflict(ApiError):
    status, code = 409, "conflict"


class Overloaded(ApiError):
    status, code = 429, "overloaded"
