"""The trajectory board: one static page (HTML, JS, CSS in `rollout_service/board/`) that
watches batches and their trajectories through the public API, live.

The page holds no data, so it is served without auth; its script asks for an API key when
the API answers 401, keeps it in localStorage and sends it as `Authorization: Bearer`.
A strict Content-Security-Policy (same origin only, no inline script) backs up the rule the
script follows anyway: every string from the API is rendered as text, never as HTML.

Non-goals: a build step, a framework, or any asset from the network.
"""

from __future__ import annotations

import functools
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import RedirectResponse, Response

from wire.errors import NotFound

router = APIRouter(tags=["board"], include_in_schema=False)

_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
                               "frame-ancestors 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@functools.cache
def _assets() -> dict[str, tuple[bytes, str]]:
    """Every file shipped in the board folder, read once: name -> (body, media type)."""
    folder = resources.files("rollout_service") / "board"
    out = {}
    for entry in folder.iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1]
        if entry.is_file() and suffix in _TYPES:
            out[entry.name] = (entry.read_bytes(), _TYPES[suffix])
    return out


def _serve(name: str) -> Response:
    asset = _assets().get(name)
    if asset is None:
        raise NotFound(f"no board asset {name!r}")
    return Response(asset[0], media_type=asset[1], headers=_HEADERS)


@router.get("/board")
async def board() -> Response:
    """The page. Its assets and API calls use relative URLs, so it works behind a path prefix."""
    return _serve("index.html")


@router.get("/board/")
async def board_slash() -> Response:
    return RedirectResponse("../board", status_code=308)


@router.get("/board/{name}")
async def asset(name: str) -> Response:
    return _serve(name)
