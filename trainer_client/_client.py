"""`RolloutClient` (sync) and `AsyncRolloutClient`: submit batches, stream trajectories.

    from trainer_client import RolloutClient
    with RolloutClient("http://127.0.0.1:8000") as c:
        batch = c.submit(tasks, env="math", group_size=4, sampling={"temperature": 1.0, "max_tokens": 256})
        for traj in c.iter_results(batch.id):    # as trajectories finish
            traj.token_ids, traj.logprobs, traj.loss_mask, traj.reward, traj.failure
        for p in c.packed_trajectories(batch.id):   # the fast way into tensors
            ids, mask, logprobs = trainer_client.tensors.as_numpy(p.samples()[0])

Trajectories travel in the compact form (`Accept: application/msgpack`, see `wire.packed`):
`trajectory`/`trajectories` hand back `Trajectory` models as before, `packed_trajectory`/
`packed_trajectories` the packed form itself, whose arrays reach numpy or torch without a
per-token step. `compact=False` asks for JSON instead.
`_Base` holds request building and response parsing; the two clients differ only in I/O.
The event stream reconnects with `Last-Event-ID`, so a gateway restart mid-batch loses
nothing. Requests ride out a restarting gateway or Redis: a refused connection, or a 502/
503/504 (honouring `Retry-After`), is tried again with bounded back-off (`retries`, about
20 s in all by default). Only requests safe to repeat are repeated after they may have
reached the gateway: reads, deletes, and `submit`, which always carries an idempotency key
(one is made up when the caller gives none), so a retried submit never makes two batches.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

import httpx

from trainer_client._errors import APIError, NotFoundError, TransportError, WeightUpdateError
from wire import (
    ApiKeyCreate,
    ApiKeyCreated,
    BatchCreated,
    BatchStatus,
    EngineRoleUpdate,
    GroupStatus,
    RolloutRequest,
    SamplingParams,
    StateRules,
    Trajectory,
    TrajectoryEvent,
    TrajectoryPage,
    WeightUpdate,
    WeightUpdateResult,
    WorkerInfo,
)
from wire.packed import MEDIA_TYPE, MEDIA_TYPES, PackedTrajectory, pack_trajectory, unpack, unpack_page, unpack_trajectory

JSON = "application/json"

_RETRY_STATUS = frozenset({502, 503, 504})  # a gateway or its Redis restarting


# errors a request is repeated after (when safe to repeat): the connection's, and a body that
# cannot be decoded (cut short)
_RETRIED = (httpx.TransportError, httpx.DecodingError)


def unzstd(body: bytes) -> bytes:
    """A zstd body opened frame by frame. The gateway sends the compact form as several frames
    back to back (stored frames go out as they are); httpx's own decoder fails where a frame
    ends exactly at a read boundary ("cannot use a decompressobj multiple times"), so the
    clients read such a body raw and open it here."""
    import zstandard  # there whenever httpx asked for zstd: it does so only with zstandard installed

    out = []
    while body:
        d = zstandard.ZstdDecompressor().decompressobj()
        try:
            out.append(d.decompress(body))
        except zstandard.ZstdError as e:
            raise httpx.DecodingError(f"zstd body: {e}") from e
        if not d.eof:
            raise httpx.DecodingError("zstd body cut short")
        body = d.unused_data
    return b"".join(out)


def _opened(r: httpx.Response, raw: bytes) -> httpx.Response:
    """`r` with its zstd body opened (`unzstd`); `r` itself is read raw and closed by the caller."""
    headers = [(k, v) for k, v in r.headers.multi_items() if k.lower() not in ("content-encoding", "content-length")]
    return httpx.Response(r.status_code, headers=headers, content=unzstd(raw), request=r.request)


def _zstd(r: httpx.Response) -> bool:
    return r.headers.get("content-encoding", "").strip().lower() == "zstd"


class _Base:
    def __init__(self, base_url: str, api_key: str | None, retries: int = 8, compact: bool = True):
        self.base_url = base_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.retries = retries
        # Trajectory reads ask for the compact form (wire.packed); JSON is still read if that is
        # what comes back (an older gateway), and `compact=False` asks for JSON outright.
        self.accept = {"Accept": f"{MEDIA_TYPE}, {JSON};q=0.5" if compact else JSON}

    @staticmethod
    def packed(got: Any) -> PackedTrajectory:
        if isinstance(got, bytes):
            return unpack_trajectory(got)
        return unpack_trajectory(pack_trajectory(Trajectory.model_validate(got)))

    @staticmethod
    def unpacked(got: Any) -> Trajectory:
        return unpack(unpack_trajectory(got)) if isinstance(got, bytes) else Trajectory.model_validate(got)

    @staticmethod
    def page(got: Any) -> tuple[list[PackedTrajectory], int | None]:
        if isinstance(got, bytes):
            return unpack_page(got)
        page = TrajectoryPage.model_validate(got)
        return [unpack_trajectory(pack_trajectory(t)) for t in page.items], page.next_cursor

    def delay(self, tries: int, method: str, kw: dict, error: Exception | None = None,
              response: httpx.Response | None = None) -> float | None:
        """Seconds to wait before trying again, or None to give up (and report)."""
        if tries >= self.retries:
            return None
        repeatable = method != "POST" or bool((kw.get("json") or {}).get("idempotency_key"))
        if error is not None:
            if not isinstance(error, httpx.ConnectError) and not repeatable:
                return None  # it may have arrived: never repeat what is not safe to repeat
        elif response is None or response.status_code not in _RETRY_STATUS or not repeatable:
            return None
        wait = min(0.2 * 2 ** tries, 5.0)
        hint = response.headers.get("retry-after", "") if response is not None else ""
        return max(wait, min(float(hint), 30.0)) if hint.isdigit() else wait

    @staticmethod
    def build(tasks: Iterable[dict[str, Any]], env: str, group_size: int, sampling: dict | SamplingParams | None,
              **kw: Any) -> dict:
        kw.setdefault("idempotency_key", f"auto-{uuid.uuid4().hex}")  # a retried submit: the same batch
        if not isinstance(tasks, (list, dict, str, bytes)) and isinstance(tasks, Iterable):
            tasks = list(tasks)  # a tuple, a generator, a `datasets.Dataset` (its rows are dicts)
        req = RolloutRequest(tasks=tasks, env=env, group_size=group_size,
                             sampling=SamplingParams.model_validate(sampling or {}), **kw)
        return req.model_dump(mode="json", exclude_none=True)

    @staticmethod
    def weights_body(path: str | os.PathLike | None, lora: tuple[str, str | os.PathLike] | None,
                     version: int | None) -> dict:
        if (path is None) == (lora is None):
            raise ValueError("give a checkpoint path or lora=(name, path), exactly one")
        body = WeightUpdate(path=_for_engines(lora[1]), lora_name=lora[0], version=version) if lora else \
            WeightUpdate(path=_for_engines(path), version=version)
        return body.model_dump(mode="json", exclude_none=True)

    @staticmethod
    def checked_update(result: WeightUpdateResult) -> WeightUpdateResult:
        if not result.ok:
            failed = ", ".join(f"{r.engine_id}: {r.error}" for r in result.results if not r.ok)
            raise WeightUpdateError(f"weight update to version {result.version} failed on {failed}", result)
        return result

    @staticmethod
    def check(r: httpx.Response, text: bool = False) -> Any:
        if r.status_code < 400:
            if r.headers.get("content-type", "").split(";")[0].strip() in MEDIA_TYPES:
                return r.content
            return r.text if text else r.json()
        try:
            err = r.json()["error"]
        except (ValueError, KeyError, TypeError):
            err = {"code": "http_error", "message": r.text[:500]}
        cls = NotFoundError if r.status_code == 404 else APIError
        raise cls(r.status_code, err.get("code", "http_error"), err.get("message", ""), err.get("details"))


_DONE = object()  # the stream's end-of-batch marker


class _SSE:
    """Server-sent events, one line at a time: `feed` returns a TrajectoryEvent, `_DONE`, or
    None; `last` is the id to resume from."""

    def __init__(self, last: str = "0"):
        self.last = last
        self._fields: dict[str, str] = {}

    def feed(self, line: str):
        if line:
            name, _, value = line.partition(":")
            self._fields[name] = value[1:] if value.startswith(" ") else value
            return None
        f, self._fields = self._fields, {}
        self.last = f.get("id") or self.last
        if f.get("event") == "done":
            return _DONE
        if f.get("event") == "trajectory" and f.get("data"):
            return TrajectoryEvent.model_validate_json(f["data"])
        return None


def _for_engines(path: str | os.PathLike) -> str:
    """A checkpoint path as the engines must read it: one relative to this process's folder that
    exists here (`ckpt/step-3`) made absolute (an engine reads it from its own folder, and vLLM
    takes a path it cannot find for a model hub name: the load fails, and a failed in-place load
    leaves vLLM without usable weights until it restarts). Anything else goes as given."""
    path = os.fspath(path)
    return os.path.abspath(path) if not os.path.isabs(path) and os.path.exists(path) else path


class RolloutClient(_Base):
    def __init__(self, base_url: str = "http://127.0.0.1:8000", api_key: str | None = None, timeout: float = 30.0,
                 transport: httpx.BaseTransport | None = None, retries: int = 8, compact: bool = True):
        super().__init__(base_url, api_key, retries, compact)
        self._http = httpx.Client(base_url=self.base_url, headers=self.headers, timeout=timeout, transport=transport)

    def __enter__(self) -> "RolloutClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        r = self._http.send(self._http.build_request(method, path, **kw), stream=True)
        try:
            if _zstd(r):
                return _opened(r, b"".join(r.iter_raw()))
            r.read()
            return r
        finally:
            r.close()

    def _req(self, method: str, path: str, text: bool = False, **kw: Any) -> Any:
        tries = 0
        while True:
            try:
                r = self._send(method, path, **kw)
            except _RETRIED as e:
                if (wait := self.delay(tries, method, kw, error=e)) is None:
                    raise TransportError(f"cannot reach {self.base_url}: {e!r}") from e
            else:
                if (wait := self.delay(tries, method, kw, response=r)) is None:
                    return self.check(r, text)
            time.sleep(wait)
            tries += 1

    def submit(self, tasks: Iterable[dict[str, Any]], env: str, group_size: int = 1,
               sampling: dict | SamplingParams | None = None, **kw: Any) -> BatchCreated:
        """Queue a batch; returns at once. kw: max_turns, max_total_tokens, deadline_s, idempotency_key,
        priority (-100..100: among your batches, higher runs first), ..."""
        return BatchCreated.model_validate(self._req("POST", "/v1/batches",
                                                     json=self.build(tasks, env, group_size, sampling, **kw)))

    def status(self, batch_id: str) -> BatchStatus:
        return BatchStatus.model_validate(self._req("GET", f"/v1/batches/{batch_id}"))

    def cancel(self, batch_id: str) -> BatchStatus:
        return BatchStatus.model_validate(self._req("DELETE", f"/v1/batches/{batch_id}"))

    def request(self, batch_id: str) -> RolloutRequest:
        """The batch as submitted: its parameters and its tasks (one per group, in order)."""
        return RolloutRequest.model_validate(self._req("GET", f"/v1/batches/{batch_id}/request"))

    def trajectory(self, trajectory_id: str) -> Trajectory:
        return self.unpacked(self._req("GET", f"/v1/trajectories/{trajectory_id}", headers=self.accept))

    def packed_trajectory(self, trajectory_id: str) -> PackedTrajectory:
        """The compact form: token arrays as bytes (`trainer_client.tensors` views them as arrays)."""
        return self.packed(self._req("GET", f"/v1/trajectories/{trajectory_id}", headers=self.accept))

    def groups(self, batch_id: str) -> list[GroupStatus]:
        """Per GRPO group: members done, usable (fit for the loss), failed, rewards."""
        return [GroupStatus.model_validate(g) for g in self._req("GET", f"/v1/batches/{batch_id}/groups")]

    def trajectories(self, batch_id: str, page_size: int = 100) -> Iterator[Trajectory]:
        """Every trajectory of the batch in submission order (finished or not)."""
        for p in self.packed_trajectories(batch_id, page_size):
            yield unpack(p)

    def packed_trajectories(self, batch_id: str, page_size: int = 100) -> Iterator[PackedTrajectory]:
        """`trajectories` in the compact form (the fast way into tensors: `trainer_client.tensors`)."""
        cursor: int | None = 0
        while cursor is not None:
            items, cursor = self.page(self._req("GET", f"/v1/batches/{batch_id}/trajectories", headers=self.accept,
                                                params={"cursor": cursor, "limit": page_size}))
            yield from items

    def events(self, batch_id: str) -> Iterator[TrajectoryEvent]:
        """Terminal events as they happen; reconnects (resuming) if the stream drops."""
        last, failures = "0", 0
        while True:
            try:
                with self._http.stream("GET", f"/v1/batches/{batch_id}/events",
                                       headers={"Last-Event-ID": last}, timeout=httpx.Timeout(30.0, read=None)) as r:
                    if r.status_code >= 400:
                        r.read()
                        if (wait := self.delay(failures, "GET", {}, response=r)) is None:
                            self.check(r)
                        time.sleep(wait)
                        failures += 1
                        continue
                    failures, sse = 0, _SSE(last)
                    for line in r.iter_lines():
                        ev = sse.feed(line)
                        last = sse.last
                        if ev is _DONE:
                            return
                        if ev is not None:
                            yield ev
            except (httpx.TransportError, httpx.RemoteProtocolError) as e:
                if (wait := self.delay(failures, "GET", {}, error=e)) is None:
                    raise TransportError(f"event stream lost: {e!r}") from e
                time.sleep(wait)
                failures += 1

    def iter_results(self, batch_id: str) -> Iterator[Trajectory]:
        """Full trajectories, each as soon as it finishes."""
        for ev in self.events(batch_id):
            yield self.trajectory(ev.trajectory_id)

    def iter_packed_results(self, batch_id: str) -> Iterator[PackedTrajectory]:
        """`iter_results` in the compact form."""
        for ev in self.events(batch_id):
            yield self.packed_trajectory(ev.trajectory_id)

    def wait(self, batch_id: str, poll_s: float = 0.5, timeout: float | None = None) -> BatchStatus:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            st = self.status(batch_id)
            if st.state.terminal and st.finished_at is not None:
                return st
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"batch {batch_id} not done after {timeout}s")
            time.sleep(poll_s)

    def batches(self, limit: int = 20) -> list[BatchStatus]:
        """The most recent batches (the caller's tenant's; every tenant's for an admin key)."""
        return [BatchStatus.model_validate(b) for b in self._req("GET", "/v1/batches", params={"limit": limit})]

    def states(self) -> StateRules:
        return StateRules.model_validate(self._req("GET", "/v1/states"))

    def metrics(self) -> str:
        """The gateway's Prometheus text (what `rollout status` renders as tables)."""
        return self._req("GET", "/metrics", text=True)

    # -- admin (an admin key when auth is on) --

    def engines(self) -> list[dict]:
        return self._req("GET", "/v1/engines")

    def register_engine(self, id: str, url: str, **kw: Any) -> dict:
        return self._req("POST", "/v1/engines", json={"id": id, "url": url, **kw})

    def deregister_engine(self, engine_id: str) -> dict:
        return self._req("DELETE", f"/v1/engines/{engine_id}")

    def set_engine_role(self, engine_id: str, role: str) -> dict:
        """prefill | decode | mixed (what the allocator otherwise decides)."""
        return self._req("PUT", f"/v1/engines/{engine_id}/role", json=EngineRoleUpdate(role=role).model_dump())

    def workers(self) -> list[WorkerInfo]:
        return [WorkerInfo.model_validate(w) for w in self._req("GET", "/v1/workers")]

    def create_api_key(self, tenant: str, admin: bool = False) -> ApiKeyCreated:
        """A new key for `tenant`; the answer is the only time it is shown."""
        return ApiKeyCreated.model_validate(self._req("POST", "/v1/keys", json=ApiKeyCreate(
            tenant=tenant, admin=admin).model_dump()))

    def update_weights(self, path: str | None = None, lora: tuple[str, str] | None = None,
                       version: int | None = None, timeout: float = 600.0) -> WeightUpdateResult:
        """Move every engine to new weights (a full checkpoint folder, or `lora=(name, path)`).
        Raises WeightUpdateError (with `.result`) if any engine failed."""
        return self.checked_update(WeightUpdateResult.model_validate(self._req(
            "POST", "/v1/weights", json=self.weights_body(path, lora, version), timeout=timeout)))


class AsyncRolloutClient(_Base):
    def __init__(self, base_url: str = "http://127.0.0.1:8000", api_key: str | None = None, timeout: float = 30.0,
                 transport: httpx.AsyncBaseTransport | None = None, retries: int = 8, compact: bool = True):
        super().__init__(base_url, api_key, retries, compact)
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=self.headers, timeout=timeout,
                                       transport=transport)

    async def __aenter__(self) -> "AsyncRolloutClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        r = await self._http.send(self._http.build_request(method, path, **kw), stream=True)
        try:
            if _zstd(r):
                return _opened(r, b"".join([c async for c in r.aiter_raw()]))
            await r.aread()
            return r
        finally:
            await r.aclose()

    async def _req(self, method: str, path: str, text: bool = False, **kw: Any) -> Any:
        tries = 0
        while True:
            try:
                r = await self._send(method, path, **kw)
            except _RETRIED as e:
                if (wait := self.delay(tries, method, kw, error=e)) is None:
                    raise TransportError(f"cannot reach {self.base_url}: {e!r}") from e
            else:
                if (wait := self.delay(tries, method, kw, response=r)) is None:
                    return self.check(r, text)
            await asyncio.sleep(wait)
            tries += 1

    async def submit(self, tasks: Iterable[dict[str, Any]], env: str, group_size: int = 1,
                     sampling: dict | SamplingParams | None = None, **kw: Any) -> BatchCreated:
        return BatchCreated.model_validate(await self._req("POST", "/v1/batches",
                                                           json=self.build(tasks, env, group_size, sampling, **kw)))

    async def status(self, batch_id: str) -> BatchStatus:
        return BatchStatus.model_validate(await self._req("GET", f"/v1/batches/{batch_id}"))

    async def cancel(self, batch_id: str) -> BatchStatus:
        return BatchStatus.model_validate(await self._req("DELETE", f"/v1/batches/{batch_id}"))

    async def request(self, batch_id: str) -> RolloutRequest:
        return RolloutRequest.model_validate(await self._req("GET", f"/v1/batches/{batch_id}/request"))

    async def trajectory(self, trajectory_id: str) -> Trajectory:
        return self.unpacked(await self._req("GET", f"/v1/trajectories/{trajectory_id}", headers=self.accept))

    async def packed_trajectory(self, trajectory_id: str) -> PackedTrajectory:
        return self.packed(await self._req("GET", f"/v1/trajectories/{trajectory_id}", headers=self.accept))

    async def groups(self, batch_id: str) -> list[GroupStatus]:
        return [GroupStatus.model_validate(g) for g in await self._req("GET", f"/v1/batches/{batch_id}/groups")]

    async def trajectories(self, batch_id: str, page_size: int = 100) -> AsyncIterator[Trajectory]:
        async for p in self.packed_trajectories(batch_id, page_size):
            yield unpack(p)

    async def packed_trajectories(self, batch_id: str, page_size: int = 100) -> AsyncIterator[PackedTrajectory]:
        cursor: int | None = 0
        while cursor is not None:
            items, cursor = self.page(await self._req("GET", f"/v1/batches/{batch_id}/trajectories",
                                                      headers=self.accept,
                                                      params={"cursor": cursor, "limit": page_size}))
            for t in items:
                yield t

    async def events(self, batch_id: str) -> AsyncIterator[TrajectoryEvent]:
        last, failures = "0", 0
        while True:
            try:
                async with self._http.stream("GET", f"/v1/batches/{batch_id}/events",
                                             headers={"Last-Event-ID": last},
                                             timeout=httpx.Timeout(30.0, read=None)) as r:
                    if r.status_code >= 400:
                        await r.aread()
                        if (wait := self.delay(failures, "GET", {}, response=r)) is None:
                            self.check(r)
                        await asyncio.sleep(wait)
                        failures += 1
                        continue
                    failures, sse = 0, _SSE(last)
                    async for line in r.aiter_lines():
                        ev = sse.feed(line)
                        last = sse.last
                        if ev is _DONE:
                            return
                        if ev is not None:
                            yield ev
            except (httpx.TransportError, httpx.RemoteProtocolError) as e:
                if (wait := self.delay(failures, "GET", {}, error=e)) is None:
                    raise TransportError(f"event stream lost: {e!r}") from e
                await asyncio.sleep(wait)
                failures += 1

    async def iter_results(self, batch_id: str) -> AsyncIterator[Trajectory]:
        async for ev in self.events(batch_id):
            yield await self.trajectory(ev.trajectory_id)

    async def iter_packed_results(self, batch_id: str) -> AsyncIterator[PackedTrajectory]:
        async for ev in self.events(batch_id):
            yield await self.packed_trajectory(ev.trajectory_id)

    async def batches(self, limit: int = 20) -> list[BatchStatus]:
        return [BatchStatus.model_validate(b) for b in await self._req("GET", "/v1/batches", params={"limit": limit})]

    async def states(self) -> StateRules:
        return StateRules.model_validate(await self._req("GET", "/v1/states"))

    async def metrics(self) -> str:
        return await self._req("GET", "/metrics", text=True)

    async def engines(self) -> list[dict]:
        return await self._req("GET", "/v1/engines")

    async def register_engine(self, id: str, url: str, **kw: Any) -> dict:
        return await self._req("POST", "/v1/engines", json={"id": id, "url": url, **kw})

    async def deregister_engine(self, engine_id: str) -> dict:
        return await self._req("DELETE", f"/v1/engines/{engine_id}")

    async def set_engine_role(self, engine_id: str, role: str) -> dict:
        return await self._req("PUT", f"/v1/engines/{engine_id}/role",
                               json=EngineRoleUpdate(role=role).model_dump())

    async def workers(self) -> list[WorkerInfo]:
        return [WorkerInfo.model_validate(w) for w in await self._req("GET", "/v1/workers")]

    async def create_api_key(self, tenant: str, admin: bool = False) -> ApiKeyCreated:
        return ApiKeyCreated.model_validate(await self._req("POST", "/v1/keys", json=ApiKeyCreate(
            tenant=tenant, admin=admin).model_dump()))

    async def update_weights(self, path: str | None = None, lora: tuple[str, str] | None = None,
                             version: int | None = None, timeout: float = 600.0) -> WeightUpdateResult:
        return self.checked_update(WeightUpdateResult.model_validate(await self._req(
            "POST", "/v1/weights", json=self.weights_body(path, lora, version), timeout=timeout)))

    async def wait(self, batch_id: str, poll_s: float = 0.5, timeout: float | None = None) -> BatchStatus:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            st = await self.status(batch_id)
            if st.state.terminal and st.finished_at is not None:
                return st
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"batch {batch_id} not done after {timeout}s")
            await asyncio.sleep(poll_s)


__all__ = ["AsyncRolloutClient", "RolloutClient"]
