"""Content negotiation for trajectory reads: JSON by default, the compact form on request.

    Accept: (none), */*, application/json, application/*   -> JSON (for humans, curl, browsers)
    Accept: application/msgpack (x-msgpack, vnd.msgpack)    -> the compact form (`wire.packed`)
    Accept: text/csv (only types we cannot serve)           -> 406 not_acceptable, naming ours
    Accept: application/msgpack;q=abc (malformed q)         -> 400 invalid_request

The compact form goes out with `Content-Encoding: zstd` when `Accept-Encoding` admits zstd
(results are stored as zstd frames: no work), otherwise plain.

Where several types are acceptable the highest `q` wins, then the more specific type
(`application/msgpack, */*` is msgpack; `*/*` alone is JSON). Non-goals: other formats.
"""

from __future__ import annotations

from fastapi import Response

from wire import ErrorResponse
from wire.errors import ApiError
from scheduler.results import ZSTD, compress, plain
from wire.packed import MEDIA_TYPE, MEDIA_TYPES, page_parts

JSON = "application/json"
_JSON_RANGES = {JSON: 2, "application/*": 1, "*/*": 0}  # media range -> specificity


def negotiate(accept: str | None) -> str:
    """`JSON` or `wire.packed.MEDIA_TYPE` for an Accept header; raises ApiError 400/406."""
    if accept is None or not accept.strip():
        return JSON
    best: tuple[float, int, str] | None = None
    for part in accept.split(","):
        media, *params = (p.strip() for p in part.split(";"))
        media, q = media.lower(), 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    raise ApiError(f"Accept: {part.strip()!r} has a q value that is not a number", status=400,
                                   code="invalid_request") from None
                if not 0 <= q <= 1:
                    raise ApiError(f"Accept: {part.strip()!r} has a q value outside 0..1", status=400,
                                   code="invalid_request")
        if q == 0:
            continue
        if media in MEDIA_TYPES:
            got = (q, 2, MEDIA_TYPE)
        elif media in _JSON_RANGES:
            got = (q, _JSON_RANGES[media], JSON)
        else:
            continue
        if best is None or got[:2] > best[:2]:
            best = got
    if best is None:
        raise ApiError(f"cannot answer in any type that Accept: {accept[:200]!r} admits; this endpoint serves "
                       f"{JSON} (the default) and {MEDIA_TYPE}", status=406, code="not_acceptable",
                       details={"supported": [JSON, MEDIA_TYPE]})
    return best[2]


def zstd_ok(accept_encoding: str | None) -> bool:
    """Whether `Accept-Encoding` admits zstd (by name or `*`, with q > 0)."""
    for part in (accept_encoding or "").split(","):
        coding, *params = (p.strip().lower() for p in part.split(";"))
        q = next((p.partition("=")[2] for p in params if p.startswith("q=")), "1")
        try:
            if coding in ("zstd", "*") and float(q) > 0:
                return True
        except ValueError:
            continue  # a malformed q: that coding is not admitted (the response is still readable)
    return False


def packed_response(stored: list[bytes], zstd: bool, page: tuple[int | None] | None = None) -> Response:
    """One stored trajectory (`page` None), or a page of them followed by `page[0]`, the next
    cursor. With `zstd`, stored frames go out as they are, between two small frames of our own
    (a zstd stream may hold several frames back to back); without, each is opened."""
    head, tail = page_parts(len(stored), page[0]) if page is not None else (b"", b"")
    headers = {"Vary": "Accept, Accept-Encoding"}
    if zstd:
        parts = [compress(head) if head else b"", *(s if s[:4] == ZSTD else compress(s) for s in stored),
                 compress(tail) if tail else b""]
        headers["Content-Encoding"] = "zstd"
    else:
        parts = [head, *(plain(s) for s in stored), tail]
    return Response(content=b"".join(parts), media_type=MEDIA_TYPE, headers=headers)


# OpenAPI: what the two trajectory reads answer besides their JSON model.
RESPONSES: dict[int | str, dict] = {
    200: {"content": {MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}},
          "description": f"JSON by default; with `Accept: {MEDIA_TYPE}` the compact form: the same document in "
                         "msgpack, token ids as int32 and logprobs as float32 little-endian bytes (see wire.packed)"},
    400: {"model": ErrorResponse, "description": "Malformed Accept header (a q value that is not a number)"},
    406: {"model": ErrorResponse, "description": f"Accept admits neither {JSON} nor {MEDIA_TYPE}"},
}
