"""Errors of the trainer client.

    RolloutError
    ├── APIError            the gateway answered 4xx/5xx; `.status`, `.code`, `.details`
    │   └── NotFoundError   404
    ├── TransportError      the gateway could not be reached (after retries)
    └── WeightUpdateError   some engines failed a weight update; `.result` says which
"""

from __future__ import annotations

from typing import Any


class RolloutError(Exception):
    pass


class APIError(RolloutError):
    def __init__(self, status: int, code: str, message: str, details: Any = None):
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.details = status, code, message, details


class NotFoundError(APIError):
    pass


class TransportError(RolloutError):
    pass


class WeightUpdateError(RolloutError):
    def __init__(self, message: str, result: Any):
        super().__init__(message)
        self.result = result
