"""The compact trajectory form: msgpack, with every token array packed as raw little-endian bytes.

JSON (`application/json`) stays the default for humans; a client that sends
`Accept: application/msgpack` on `GET /v1/trajectories/{id}` or `GET /v1/batches/{id}/trajectories`
gets this form, and the trainer SDK asks for it. It is the `Trajectory` (or `TrajectoryPage`)
document with the same keys, except that these arrays are msgpack `bin` values:

    Turn.prompt_ids, Turn.output_ids        int32   (`<i4`, 4 bytes per token)
    Turn.output_logprobs                    float32 (`<f4`, 4 bytes per token)
    Sample.token_ids / loss_mask / logprobs int32 / uint8 / float32 (with `?samples=true`)

An integer beyond 64 bits, which msgpack's own integers cannot hold (free-form values: a task's
answer of 2**100, a 128-bit hash in an env's `info`), is extension type 1 (`BIG_INT`) whose data
is the integer's decimal digits in ASCII, sign first: `int(data)`. The readers here give back
the integer; another msgpack reader gives its extension value (msgpack-python: `ExtType`).

Logprobs are float32 here and at rest: engines compute them in float32 (vLLM's are exact
float32 values), so nothing an engine returned is lost; a float64 value from elsewhere is
rounded to the nearest float32. Token ids must fit in int32 (every vocabulary does).

Over HTTP the compact form comes with `Content-Encoding: zstd` when the request's
`Accept-Encoding` admits zstd (httpx does when `zstandard` is installed, and decodes it itself);
otherwise plain. Compression is HTTP's business, not this format's: what is decoded is this.

Non-goals: any field the JSON form lacks. `Trajectory` stays the one schema:
the packed models below are built from its fields, so a field added there appears here.

Example:
    >>> from wire import Trajectory, TrajectoryState, Turn
    >>> t = Trajectory(id="b-0-0", batch_id="b", group_index=0, sample_index=0, env="math", task={},
    ...                state=TrajectoryState.completed, turns=[Turn(index=0, prompt_ids=[1, 2], output_ids=[3],
    ...                output_logprobs=[-0.5], finish_reason="stop", policy_version=0, engine_id="e")])
    >>> p = unpack_trajectory(pack_trajectory(t))
    >>> p.samples()[0].token_ids == pack_ints([1, 2, 3]), unpack(p) == t
    (True, True)
"""

from __future__ import annotations

import struct
import sys
import threading
from array import array
from typing import Any

import msgpack
from pydantic import BaseModel, Field, create_model
from pydantic_core import to_jsonable_python

from wire.base import Wire
from wire.batches import Sample, Trajectory, TrajectoryPage, Turn

MEDIA_TYPE = "application/msgpack"
BIG_INT = 1  # msgpack extension type of an integer beyond 64 bits (see above)
# Names other msgpack clients send for the same thing.
MEDIA_TYPES = frozenset({MEDIA_TYPE, "application/x-msgpack", "application/vnd.msgpack"})

_TURN_ARRAYS = {"prompt_ids": "i", "output_ids": "i", "output_logprobs": "f"}
_SAMPLE_ARRAYS = {"token_ids": "i", "loss_mask": "B", "logprobs": "f"}
assert array("i").itemsize == 4 and array("f").itemsize == 4, "int32/float32 arrays need a C int of 4 bytes"
_SWAP = sys.byteorder != "little"  # the wire is little-endian; so is every machine we run on


# Compiled `struct` formats by item code and length, at most STRUCTS_CACHED (then all go): a
# turn packs three arrays, and `struct.pack`'s own cache (100 formats, all dropped when full)
# keeps few of the lengths a worker sees; compiled once, each array packs ~0.4 µs sooner.
STRUCTS_CACHED = 4096
_structs: dict[str, dict[int, struct.Struct]] = {"i": {}, "f": {}, "B": {}}
_local = threading.local()  # a msgpack Packer per thread (`_packer`)


def _pack(code: str, values: Any) -> bytes:
    """`values` as little-endian `code` items. `struct` takes a list 1.3-2x faster than `array`
    does; where it refuses (a float beyond float32's range, an int beyond int32's), `array` gives
    what it always gave (±inf; OverflowError)."""
    if not isinstance(values, (list, tuple)):
        values = list(values)
    n = len(values)
    formats = _structs[code]
    s = formats.get(n)
    if s is None:
        if len(formats) >= STRUCTS_CACHED:
            formats.clear()
        s = formats[n] = struct.Struct(f"<{n}{code}")
    try:
        return s.pack(*values)
    except (struct.error, OverflowError):
        a = array(code, values)
        if _SWAP:
            a.byteswap()
        return a.tobytes()


def _unpack(code: str, raw: bytes) -> list:
    a = array(code)
    a.frombytes(raw)
    if _SWAP:
        a.byteswap()
    return a.tolist()


def pack_ints(values: Any) -> bytes:
    """int32 little-endian bytes (what `np.frombuffer(b, "<i4")` reads back)."""
    return _pack("i", values)


def pack_floats(values: Any) -> bytes:
    """float32 little-endian bytes (what `np.frombuffer(b, "<f4")` reads back)."""
    return _pack("f", values)


def _packed_model(base: type[Wire], arrays: dict[str, str], name: str, **extra: Any) -> type[Wire]:
    """`base`'s fields, with the `arrays` ones as bytes: the same schema, packed."""
    fields: dict[str, Any] = {n: (bytes, Field(description=f"{base.__name__}.{n}, packed ({arrays[n]})"))
                              if n in arrays else (f.annotation, f) for n, f in base.model_fields.items()}
    fields.update(extra)
    return create_model(name, __base__=Wire, **fields)


PackedTurn = _packed_model(Turn, _TURN_ARRAYS, "PackedTurn")
PackedSample = _packed_model(Sample, _SAMPLE_ARRAYS, "PackedSampleFields")


class TrainingArrays(PackedSample):  # type: ignore[misc,valid-type]
    """One training sample as packed arrays: `token_ids` int32, `loss_mask` uint8, `logprobs`
    float32, aligned (`trainer_client.tensors` views them as numpy arrays or torch tensors)."""


_PackedTrajectoryFields = _packed_model(
    Trajectory, {}, "PackedTrajectoryFields", turns=(list[PackedTurn], Field(default_factory=list)),  # type: ignore[valid-type]
    training_samples=(list[TrainingArrays] | None, None))


class PackedTrajectory(_PackedTrajectoryFields):  # type: ignore[misc,valid-type]
    """A trajectory in the compact form: `Trajectory`'s fields, token arrays as bytes."""

    def samples(self) -> list[TrainingArrays]:
        """One training sample per segment, concatenated as bytes (no per-token Python work)."""
        if self.training_samples is not None:
            return self.training_samples
        parts: dict[int, tuple[list[bytes], list[bytes], list[bytes]]] = {}
        for t in self.turns:
            ids, mask, lps = parts.setdefault(t.segment, ([], [], []))
            n_prompt, n_out = len(t.prompt_ids) // 4, len(t.output_ids) // 4
            ids += [t.prompt_ids, t.output_ids]
            mask += [bytes(n_prompt), b"\x01" * n_out]
            lps += [bytes(4 * n_prompt), t.output_logprobs]
        return [TrainingArrays(token_ids=b"".join(i), loss_mask=b"".join(m), logprobs=b"".join(lp))
                for i, m, lp in (parts[k] for k in sorted(parts))]

    @property
    def usable(self) -> bool:
        return self.state.usable


def _packable(o: Any) -> Any:
    """msgpack's hook for what it cannot encode itself: a model as its fields (`__dict__`, in
    declaration order: no serializers or aliases on the wire models), a turn with its token arrays
    packed, anything else as the JSON form would have it. Encoding the models directly, rather than
    through `model_dump`, saves a worker ~14 µs of its ~22 a result (benchmarks/queue_overhead.py)."""
    if type(o) is int:  # beyond 64 bits (msgpack asks its hook only then)
        return msgpack.ExtType(BIG_INT, str(o).encode())
    if isinstance(o, Turn):
        return _turn_fields(o)
    if isinstance(o, BaseModel):
        return o.__dict__
    return to_jsonable_python(o)


def _turn_fields(t: Turn) -> dict[str, Any]:
    d = dict(t.__dict__)
    for n, code in _TURN_ARRAYS.items():
        d[n] = _pack(code, d[n])
    d["timings"] = t.timings.__dict__
    return d


def _pack_sample(s: Sample) -> dict[str, Any]:
    return {n: _pack(code, getattr(s, n)) for n, code in _SAMPLE_ARRAYS.items()}


def pack_trajectory(t: Trajectory, samples: bool = True) -> bytes:
    """`t` in the compact form; `samples=False` leaves its training samples out (None), as
    results are stored."""
    d = dict(t.__dict__)
    d["task"], d["info"] = to_jsonable_python(t.task), to_jsonable_python(t.info)  # free-form: as JSON has them
    d["training_samples"] = None if t.training_samples is None or not samples else [
        _pack_sample(s) for s in t.training_samples]
    # the turns and messages as `_packable` has them, built here: a hook call per model costs more
    d["turns"] = [_turn_fields(x) for x in t.turns]
    d["messages"] = [m.__dict__ for m in t.messages]
    return _packer().pack(d)


def _packer() -> msgpack.Packer:
    """This thread's Packer for trajectories and turns: `msgpack.packb` makes one, with a 256 KiB
    buffer, each call (~0.5 µs of a result's ~8). A Packer resets itself after each `pack`, and
    after one that raised."""
    p = getattr(_local, "packer", None)
    if p is None:
        p = _local.packer = msgpack.Packer(default=_packable, use_bin_type=True)
    return p


def pack_turn(t: Turn) -> bytes:
    return _packer().pack(t)


def _ext(code: int, data: bytes) -> Any:
    return int(data) if code == BIG_INT else msgpack.ExtType(code, data)


def _unpackb(raw: bytes) -> Any:
    return msgpack.unpackb(raw, raw=False, ext_hook=_ext)


def unpack_turn(raw: bytes) -> Turn:
    d = _unpackb(raw)
    d.update({n: _unpack(code, d[n]) for n, code in _TURN_ARRAYS.items()})
    return Turn.model_validate(d)


def unpack_trajectory(raw: bytes) -> PackedTrajectory:
    return PackedTrajectory.model_validate(_unpackb(raw))


def unpack_page(raw: bytes) -> tuple[list[PackedTrajectory], int | None]:
    """A `TrajectoryPage` in the compact form: `{"items": [...], "next_cursor": n}`."""
    d = _unpackb(raw)
    return [PackedTrajectory.model_validate(t) for t in d["items"]], d["next_cursor"]


def unpack(p: PackedTrajectory) -> Trajectory:
    """Back to the JSON form's model (lists of Python numbers): for humans and old code."""
    d = p.model_dump(exclude={"turns", "training_samples"})
    d["turns"] = [{**t.model_dump(exclude=set(_TURN_ARRAYS)),
                   **{n: _unpack(code, getattr(t, n)) for n, code in _TURN_ARRAYS.items()}} for t in p.turns]
    if p.training_samples is not None:
        d["training_samples"] = [{n: _unpack(code, getattr(s, n)) for n, code in _SAMPLE_ARRAYS.items()}
                                 for s in p.training_samples]
    return Trajectory.model_validate(d)


def with_samples(raw: bytes) -> bytes:
    """A packed trajectory with its `training_samples` added (what `?samples=true` asks for)."""
    d = _unpackb(raw)
    d["training_samples"] = [s.model_dump() for s in PackedTrajectory.model_validate(d).samples()]
    return msgpack.packb(d, use_bin_type=True, default=_packable)


def page_bytes(items: list[bytes], next_cursor: int | None) -> bytes:
    """A compact `TrajectoryPage` from trajectories already packed (as stored): msgpack lets a
    map's values be written one after another, so the stored bytes are copied, not re-encoded."""
    head, tail = page_parts(len(items), next_cursor)
    return b"".join([head, *items, tail])


def page_parts(n: int, next_cursor: int | None) -> tuple[bytes, bytes]:
    """What goes before and after `n` packed trajectories to make a compact `TrajectoryPage`."""
    return b"\x82" + msgpack.packb("items") + _array_header(n), msgpack.packb("next_cursor") + msgpack.packb(next_cursor)


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x90 | n])
    if n < 2**16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


assert set(TrajectoryPage.model_fields) == {"items", "next_cursor"}  # page_bytes writes exactly these
