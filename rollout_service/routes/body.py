"""Request bodies as the gateway reads them: JSON in UTF-8, every string one UTF-8 can encode.

Python's parser takes more than that. It decodes bytes leniently and reads an escaped lone
surrogate (`"\\ud800"`, half of a UTF-16 pair) into a string that no later step can encode: such
a metadata value or idempotency key made the submission a 500 (or a dropped connection), and such
a task was queued, failed every attempt as the service's own fault, and then broke every read of
its batch's results. Nested deeper than Python recurses, a body was a 400 saying only that parsing
failed. `JsonRoute` reads bodies with `StrictJsonRequest`: each of these is a 422 `json_invalid`
saying what and where, before any model sees the body.

    router = APIRouter(route_class=JsonRoute)

Non-goal: limits on size (`rollout_service.limits`) or on what a value means (the `wire` models).
"""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi import Request
from fastapi.routing import APIRoute

# An escape of a UTF-16 surrogate: a pair is fine (the parser joins it into one character), a
# lone one is not. Only bodies with one are walked (emoji sent by ASCII-only encoders, say).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def lone_surrogate(value: Any, path: str = "$") -> str | None:
    """Where in parsed JSON a string (or a key) holds a lone surrogate; None if nowhere."""
    stack = [(value, path)]
    while stack:
        x, at = stack.pop()
        if type(x) is str:
            if not _encodable(x):
                return at
        elif type(x) is dict:
            for k, v in x.items():
                if not _encodable(k):
                    return f"{at} (a key)"
                stack.append((v, f"{at}.{k}"))
        elif type(x) is list:
            stack.extend((v, f"{at}[{i}]") for i, v in enumerate(x))
    return None


def _encodable(s: str) -> bool:
    try:
        s.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def parse(body: bytes) -> Any:
    """The body's JSON value; raises json.JSONDecodeError saying what is wrong and where."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise json.JSONDecodeError(f"the body is not UTF-8 ({e.reason} at byte {e.start})",
                                   body.decode("utf-8", "replace"), e.start) from None
    if text.startswith("\ufeff"):  # a byte order mark: Python's parser of bytes skips it too
        text = text[1:]
    try:
        value = json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text, 0) from None
    if _SURROGATE_ESCAPE.search(text):
        where = lone_surrogate(value)
        if where is not None:
            raise json.JSONDecodeError(f"{where} holds a lone UTF-16 surrogate (\\ud800-\\udfff), "
                                       "which is not a character", text, 0)
    return value


class StrictJsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = parse(await self.body())
        return self._json


class JsonRoute(APIRoute):
    """A route whose JSON body is read by `StrictJsonRequest`."""

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def strict(request: Request):
            return await handler(StrictJsonRequest(request.scope, request.receive))

        return strict
