"""Where finished trajectories live: a `ResultStore` holds each one's packed bytes (`wire.packed`).

    RedisResults   the bytes inline in the trajectory's hash (the default; small deployments)
    FileResults    one file per trajectory under a directory (one node, or a shared filesystem)

Results are stored as one zstd frame each (`compress_result`: large ones harder, in a thread):
less Redis memory or disk, and a page answered with `Content-Encoding: zstd` is the stored
frames back to back, never recompressed. The queue writes a result with `put` before the
finishing script runs, and the script records what `put` returned in the trajectory's `result`
field, atomically with its state: inline, that is the packed trajectory itself; for a blob
store, a reference `blob:{key}`. The key carries the lease token, so a writer whose lease
lapsed can never overwrite the winner's blob; the loser's blob is discarded at once. Every
recorded value says what it is (a reference starts with `blob:`, a stored result with zstd's
magic number or a msgpack map byte, a result written before this module with `{`), so results
written under another store stay readable after a deployment switches.

    S3Results      one object per trajectory in an S3-compatible bucket (clusters); boto3, the `s3` extra


Non-goals: caching, and deciding when results go (`scheduler.retention` does, per batch).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

import zstandard

from wire import Trajectory
from wire.packed import pack_trajectory

BLOB = b"blob:"
ZSTD = b"\x28\xb5\x2f\xfd"  # a zstd frame's magic number
# Level 1 for what is small or compressed on a request's path: on benchmarks/queue_overhead.py's
# 1.7 KB results 112k instructions a result against level 3's 135k (callgrind), the same size
# (1.786x against 1.789x), and 0.5% larger than level 3 on int32 ids of a 49k vocabulary; most
# of either is building the frame's entropy tables, which no faster level avoids but the
# negative ones (no Huffman literals: 12-13% larger). A result of LARGE bytes or more (packed:
# ~1,800 tokens) is stored at level 16, in a thread (zstd releases the GIL): on
# benchmarks/payload.py's 32k-token trajectories 4.18x smaller than JSON against 3.86x at level
# 3, for ~30 ms instead of ~1.2 ms (~1 ms per 1k tokens, once, beside minutes of generation).
# Levels 11-15 gain under 4% there; 16 is the first of zstd's `btultra` levels, 17-19 add under
# 1% for more time.
FAST_LEVEL, LARGE_LEVEL, LARGE = 1, 16, 16 * 1024


_local = threading.local()  # a compressor per thread and level: making one costs more than compressing 2 KB


def compress(packed: bytes, level: int = FAST_LEVEL) -> bytes:
    """One zstd frame of `packed` (a packed trajectory, or a page's head or tail)."""
    made = getattr(_local, "compressors", None)
    if made is None:
        made = _local.compressors = {}
    c = made.get(level)
    if c is None:
        c = made[level] = zstandard.ZstdCompressor(level=level)
    return c.compress(packed)


async def compress_results(packed: list[bytes]) -> list[bytes]:
    """Finished trajectories as stored: inline at FAST_LEVEL when small, else LARGE_LEVEL in a
    thread, off the event loop (the large ones of a call in one thread call)."""
    out = [compress(p) if len(p) < LARGE else b"" for p in packed]
    large = [i for i, p in enumerate(packed) if len(p) >= LARGE]
    if large:
        done = await asyncio.to_thread(lambda: [compress(packed[i], LARGE_LEVEL) for i in large])
        for i, stored in zip(large, done):
            out[i] = stored
    return out


async def compress_result(packed: bytes) -> bytes:
    """One finished trajectory as stored (`compress_results`)."""
    return (await compress_results([packed]))[0]


def plain(stored: bytes) -> bytes:
    """The packed trajectory, whether stored compressed or not."""
    if stored[:4] != ZSTD:
        return stored
    d = getattr(_local, "decompressor", None)
    if d is None:
        d = _local.decompressor = zstandard.ZstdDecompressor()
    return d.decompress(stored)


_SAFE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*$")  # batch and trajectory ids, lease tokens: never a path


class ResultStore(Protocol):
    """Holds packed trajectories. Only `put` writes; `get` takes the values `put` returned."""

    async def put(self, batch_id: str, trajectory_id: str, token: str, packed: bytes) -> bytes:
        """Keep `packed`; returns what the trajectory's `result` field records."""
        ...

    async def get(self, recorded: list[bytes]) -> list[bytes | None]:
        """The packed bytes for each recorded value (None where a blob is gone)."""
        ...

    async def discard(self, recorded: bytes) -> None:
        """Forget one result that lost the race to finish (never recorded in Redis)."""
        ...

    async def drop_batch(self, batch_id: str) -> None:
        """Forget every result of a batch (retention); Redis keys are `scheduler.retention`'s."""
        ...


def legacy(recorded: bytes) -> bool:
    """A result stored as JSON, before the compact form."""
    return recorded[:1] == b"{"


def repack(recorded: bytes) -> bytes:
    return compress(pack_trajectory(Trajectory.model_validate_json(recorded)))


class RedisResults:
    """The result is the recorded value itself: nothing to write, fetch or delete elsewhere."""

    async def put(self, batch_id: str, trajectory_id: str, token: str, packed: bytes) -> bytes:
        return packed

    async def get(self, recorded: list[bytes]) -> list[bytes | None]:
        return [repack(v) if legacy(v) else v for v in recorded]

    async def discard(self, recorded: bytes) -> None:
        return None

    async def drop_batch(self, batch_id: str) -> None:
        return None


class FileResults:
    """One file per result, `{root}/{batch}/{trajectory}.{token}.msgpack`, written atomically
    (a temporary file renamed into place). File I/O runs in a thread, off the event loop."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if len(parts) != 2 or not all(_SAFE.match(p) for p in parts):
            raise ValueError(f"not a result key: {key!r}")
        return self.root / parts[0] / parts[1]

    def _write(self, key: str, packed: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(packed)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise

    def _read(self, recorded: list[bytes]) -> list[bytes | None]:
        out: list[bytes | None] = []
        for v in recorded:
            if not v.startswith(BLOB):
                out.append(repack(v) if legacy(v) else v)  # written while the store was Redis
                continue
            try:
                out.append(self._path(v[len(BLOB):].decode()).read_bytes())
            except FileNotFoundError:
                out.append(None)
        return out

    async def put(self, batch_id: str, trajectory_id: str, token: str, packed: bytes) -> bytes:
        key = f"{batch_id}/{trajectory_id}.{token}.msgpack"
        await asyncio.to_thread(self._write, key, packed)
        return BLOB + key.encode()

    async def get(self, recorded: list[bytes]) -> list[bytes | None]:
        return await asyncio.to_thread(self._read, recorded)

    async def discard(self, recorded: bytes) -> None:
        if recorded.startswith(BLOB):
            await asyncio.to_thread(self._path(recorded[len(BLOB):].decode()).unlink, True)

    async def drop_batch(self, batch_id: str) -> None:
        if not _SAFE.match(batch_id):
            raise ValueError(f"not a batch id: {batch_id!r}")
        await asyncio.to_thread(shutil.rmtree, self.root / batch_id, True)


class S3Results:
    """One object per result, `{prefix}{batch}/{trajectory}.{token}.msgpack` in `bucket`, through
    boto3 (its calls run in threads). Endpoint and credentials come from boto3's usual sources:
    `AWS_ENDPOINT_URL` (MinIO, Ceph, a moto server, ...), `AWS_ACCESS_KEY_ID`, ... The bucket
    must exist; a missing object reads as gone, any other S3 error is raised."""

    def __init__(self, bucket: str, prefix: str = "", client=None):
        import boto3

        self.bucket, self.prefix = bucket, prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.s3 = client or boto3.client("s3")  # a client is thread-safe; one is shared by every call

    def _key(self, key: str) -> str:
        parts = key.split("/")
        if len(parts) != 2 or not all(_SAFE.match(p) for p in parts):
            raise ValueError(f"not a result key: {key!r}")
        return self.prefix + key

    def _read(self, v: bytes) -> bytes | None:
        if not v.startswith(BLOB):
            return repack(v) if legacy(v) else v
        try:
            return self.s3.get_object(Bucket=self.bucket, Key=self._key(v[len(BLOB):].decode()))["Body"].read()
        except self.s3.exceptions.NoSuchKey:
            return None

    async def put(self, batch_id: str, trajectory_id: str, token: str, packed: bytes) -> bytes:
        key = f"{batch_id}/{trajectory_id}.{token}.msgpack"
        await asyncio.to_thread(self.s3.put_object, Bucket=self.bucket, Key=self._key(key), Body=packed)
        return BLOB + key.encode()

    async def get(self, recorded: list[bytes]) -> list[bytes | None]:
        return list(await asyncio.gather(*(asyncio.to_thread(self._read, v) for v in recorded)))

    async def discard(self, recorded: bytes) -> None:
        if recorded.startswith(BLOB):
            await asyncio.to_thread(self.s3.delete_object, Bucket=self.bucket,
                                    Key=self._key(recorded[len(BLOB):].decode()))

    def _drop(self, batch_id: str) -> None:
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                   Prefix=f"{self.prefix}{batch_id}/")
        for page in pages:  # at most 1,000 keys a page: one delete_objects call each
            if objects := [{"Key": o["Key"]} for o in page.get("Contents", [])]:
                self.s3.delete_objects(Bucket=self.bucket, Delete={"Objects": objects, "Quiet": True})

    async def drop_batch(self, batch_id: str) -> None:
        if not _SAFE.match(batch_id):
            raise ValueError(f"not a batch id: {batch_id!r}")
        await asyncio.to_thread(self._drop, batch_id)


def result_store(url: str) -> ResultStore:
    """`redis` (inline, the default), `file:///absolute/dir` (one node's filesystem) or
    `s3://bucket/prefix` (an S3-compatible store; endpoint and credentials as boto3 finds them)."""
    if url in ("", "redis"):
        return RedisResults()
    parsed = urlparse(url)
    if parsed.scheme == "file" and parsed.path:
        return FileResults(parsed.path)
    if parsed.scheme == "s3" and parsed.netloc:
        return S3Results(parsed.netloc, parsed.path)
    raise ValueError(f"result store {url!r}: expected 'redis', file:///DIR or s3://BUCKET/PREFIX")
