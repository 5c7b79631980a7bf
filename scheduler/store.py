"""Reads of what the queue wrote: batch status, trajectory pages, the event stream, and the
parameters a worker needs to run a claimed trajectory.

Trajectories come in two forms: `Trajectory` models (for JSON) and packed bytes (`wire.packed`,
for `Accept: application/msgpack`). A terminal trajectory's result is stored packed (in Redis or
a `scheduler.results` blob store) and served packed as stored, with no decoding."""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis
from pydantic_core import from_json

from scheduler.keys import Keys
from scheduler.results import RedisResults, ResultStore, plain
from wire import (
    BatchState,
    BatchStatus,
    BatchTotals,
    Failure,
    GroupStatus,
    RolloutRequest,
    Trajectory,
    TrajectoryEvent,
    TrajectoryState,
    Turn,
)
from wire.packed import pack_trajectory, unpack, unpack_trajectory, unpack_turn

if TYPE_CHECKING:
    from scheduler.queue import Claim

_validate_event = TrajectoryEvent.__pydantic_validator__.validate_python  # from a dict (`Store.events`)
PARAMS_CACHED = 1024  # batches whose parameters a Store keeps parsed (least recently used go first)


def _task(raw: str | bytes) -> Any:
    """A stored task (JSON): pydantic-core's parser, ~1 µs faster a trajectory than `json.loads`;
    `json` for what only it reads (a lone surrogate escaped in a string)."""
    try:
        return from_json(raw)
    except ValueError:
        return json.loads(raw)


def _s(v: bytes | str | None) -> str | None:
    return v.decode() if isinstance(v, bytes) else v


@dataclass(slots=True)
class Work:
    """Everything a worker needs to run one claimed trajectory."""

    trajectory_id: str
    batch_id: str
    group_index: int
    sample_index: int
    task: dict[str, Any]
    params: RolloutRequest  # with tasks=[{}]: the batch's shared parameters (shared: never mutate)


class Store:
    def __init__(self, redis: aioredis.Redis, keys: Keys | None = None, results: ResultStore | None = None):
        self.r = redis
        self.k = keys or Keys()
        self.results = results or RedisResults()  # where terminal trajectories' packed bytes live
        self._params: OrderedDict[str, RolloutRequest] = OrderedDict()  # batch id -> its parameters (`work`)
        self._loading: dict[str, asyncio.Future] = {}  # batch id -> the one read of its parameters under way

    async def batch_status(self, bid: str) -> BatchStatus | None:
        h = {_s(k): _s(v) for k, v in (await self.r.hgetall(self.k.batch(bid))).items()}
        if not h:
            return None
        params = json.loads(h["params"])
        counts = {s: max(int(h.get(f"n:{s.value}", 0)), 0) for s in TrajectoryState}
        return BatchStatus(
            id=bid, state=BatchState(h["state"]), env=params["env"], num_trajectories=int(h["total"]),
            counts=counts, created_at=float(h["created_at"]),
            finished_at=float(h["finished_at"]) if h.get("finished_at") else None,
            metadata=params.get("metadata", {}), tenant=h.get("tenant", "default"), totals=_totals(h),
        )

    async def list_batches(self, limit: int = 50, tenant: str | None = None) -> list[str]:
        """Newest first; only `tenant`'s when given."""
        key = self.k.batches if tenant is None else self.k.tenant_batches(tenant)
        return [_s(b) for b in await self.r.zrevrange(key, 0, limit - 1)]

    async def batch_tenant(self, bid: str) -> str | None:
        return _s(await self.r.hget(self.k.batch(bid), "tenant"))

    async def trajectory(self, tid: str) -> Trajectory | None:
        """The result once terminal; before that the spec, with the running attempt's turns so far."""
        got = (await self._load([tid]))[0]
        return unpack(unpack_trajectory(plain(got))) if isinstance(got, bytes) else got

    async def trajectory_packed(self, tid: str) -> bytes | None:
        """`trajectory` in the compact form (`wire.packed`) as stored: a zstd frame (`plain` opens
        it) when terminal; a running one is packed now, uncompressed."""
        got = (await self._load([tid]))[0]
        return pack_trajectory(got) if isinstance(got, Trajectory) else got

    async def trajectories(self, bid: str, cursor: int = 0, limit: int = 50,
                           state: TrajectoryState | None = None) -> tuple[list[Trajectory], int | None]:
        """A page in submission order; the cursor is an offset into the batch."""
        got, nxt = await self._page(bid, cursor, limit, state)
        return [unpack(unpack_trajectory(plain(t))) if isinstance(t, bytes) else t for t in got], nxt

    async def trajectories_packed(self, bid: str, cursor: int = 0, limit: int = 50,
                                  state: TrajectoryState | None = None) -> tuple[list[bytes], int | None]:
        """`trajectories` in the compact form, each one as `trajectory_packed` has it."""
        got, nxt = await self._page(bid, cursor, limit, state)
        return [pack_trajectory(t) if isinstance(t, Trajectory) else t for t in got], nxt

    async def _page(self, bid: str, cursor: int, limit: int,
                    state: TrajectoryState | None) -> tuple[list[bytes | Trajectory], int | None]:
        ids = [_s(t) for t in await self.r.lrange(self.k.batch_trajs(bid), cursor, cursor + limit - 1)]
        items = [t for t in await self._load(ids, state) if t is not None]
        return items, (cursor + len(ids) if len(ids) == limit else None)

    async def _load(self, ids: list[str], state: TrajectoryState | None = None) -> list[bytes | Trajectory | None]:
        """Each trajectory as its packed result (terminal, with one) or as a Trajectory built from
        its hash; None when it is gone, has another `state`, or its result expired meanwhile."""
        pipe = self.r.pipeline()  # one transaction: the turns belong to the state read beside them
        for tid in ids:
            pipe.hgetall(self.k.traj(tid))
            pipe.lrange(self.k.traj_turns(tid), 0, -1)
        got = await pipe.execute()
        out: list[bytes | Trajectory | None] = [None] * len(ids)
        results: dict[int, bytes] = {}
        params: dict[str, dict[str, Any]] = {}
        for i, tid in enumerate(ids):
            raw, turns = got[2 * i], got[2 * i + 1]
            result = raw.pop(b"result", None) if raw else None
            h = {_s(k): _s(v) for k, v in raw.items()}
            if not h or (state is not None and h["state"] != state.value):
                continue
            if result:
                results[i] = result
                continue
            if h["batch"] not in params:
                params[h["batch"]] = json.loads(await self.r.hget(self.k.batch(h["batch"]), "params") or "{}")
            out[i] = self._spec(tid, h, params[h["batch"]], turns)
        for i, packed in zip(results, await self.results.get(list(results.values()))):
            out[i] = packed
        return out

    @staticmethod
    def _spec(tid: str, h: dict[str, Any], params: dict[str, Any], turns: list[bytes]) -> Trajectory:
        return Trajectory(
            id=tid, batch_id=h["batch"], group_index=int(h["group"]), sample_index=int(h["sample"]),
            env=params.get("env", ""), task=json.loads(h["task"]), state=TrajectoryState(h["state"]),
            failure=Failure.model_validate_json(h["failure"]) if h.get("failure") else None,
            attempts=int(h.get("attempts", 0)) + (h["state"] in ("running", "failed")), restarts=int(h.get("restarts", 0)),
            turns=[Turn.model_validate_json(t) if t[:1] == b"{" else unpack_turn(t) for t in turns]
            if h["state"] == "running" else [],
        )

    async def request(self, bid: str) -> RolloutRequest | None:
        """The batch as submitted: its parameters and its tasks (one per group, in order)."""
        params = await self.r.hget(self.k.batch(bid), "params")
        if params is None:
            return None
        ids = [_s(t) for t in await self.r.lrange(self.k.batch_trajs(bid), 0, -1)]
        pipe = self.r.pipeline(transaction=False)
        for tid in ids:
            pipe.hmget(self.k.traj(tid), "group", "task")
        tasks = {int(group): json.loads(task) for group, task in await pipe.execute() if group is not None}
        return RolloutRequest.model_validate({**json.loads(params), "tasks": [tasks[g] for g in sorted(tasks)]})

    async def groups(self, bid: str) -> list[GroupStatus]:
        """Per-group counts, read from the trajectories' small fields (not their results)."""
        ids = [_s(t) for t in await self.r.lrange(self.k.batch_trajs(bid), 0, -1)]
        pipe = self.r.pipeline(transaction=False)
        for tid in ids:
            pipe.hmget(self.k.traj(tid), "group", "sample", "state", "reward")
        groups: dict[int, list[tuple[int, TrajectoryState, float | None]]] = {}
        for group, sample, state, reward in await pipe.execute():
            groups.setdefault(int(group), []).append(
                (int(sample), TrajectoryState(_s(state)), float(reward) if reward else None))
        out = []
        for g, members in sorted(groups.items()):
            members.sort(key=lambda m: m[0])
            usable = [m for m in members if m[1].usable]
            out.append(GroupStatus(
                group_index=g, size=len(members), done=sum(m[1].terminal for m in members), usable=len(usable),
                failed=sum(m[1] is TrajectoryState.failed for m in members),
                rewards=[m[2] if m in usable else None for m in members]))
        return out

    async def finished(self, bid: str) -> bool:
        """Whether the batch is over: its `batch_done` event is in its stream (the same script
        writes both)."""
        return bool(await self.r.hexists(self.k.batch(bid), "finished_at"))

    async def events(self, bid: str, after: str = "0", block_ms: int | None = 1000,
                     count: int = 100) -> list[tuple[str, TrajectoryEvent | None]]:
        """Terminal events after stream id `after`; None marks the end of the batch. `block_ms`
        None: what is there now, without waiting (0 would wait for ever)."""
        got = await self.r.xread({self.k.batch_events(bid): after}, count=count, block=block_ms)
        out: list[tuple[str, TrajectoryEvent | None]] = []
        for _stream, entries in got or []:
            for eid, f in entries:
                if isinstance(eid, bytes):  # (a client that decodes replies gives str)
                    eid = eid.decode()
                    tid, state, reward, failure = (f[b"tid"].decode(), f[b"state"].decode(), f[b"reward"].decode(),
                                                   f[b"failure"].decode())
                else:
                    tid, state, reward, failure = f["tid"], f["state"], f["reward"], f["failure"]
                if state == "batch_done":
                    out.append((eid, None))
                    continue
                ms, n = eid.split("-")
                # validated from a dict: 1.0 µs, against 1.3 through the model's `__init__` and 2.3
                # for `model_construct`
                out.append((eid, _validate_event({
                    "trajectory_id": tid, "state": state, "reward": float(reward) if reward else None,
                    "failure": Failure.model_validate_json(failure) if failure else None,
                    "seq": int(ms) * 1000 + int(n)})))
        return out

    async def work(self, tid: str, claim: Claim | None = None) -> Work:
        """What a worker runs for trajectory `tid`; `claim`: its lease, with the fields the claim
        read along the way (then only the batch's parameters are read, once per batch)."""
        if claim is not None and claim.task is not None:
            bid, group, sample, task = claim.batch_id, claim.group_index, claim.sample_index, claim.task
        else:
            bid, group, sample, task = await self.r.hmget(self.k.traj(tid), "batch", "group", "sample", "task")
        bid = _s(bid)
        req = self._params.get(bid)
        if req is None:  # a batch's parameters never change once submitted: read and validated once
            loading = self._loading.get(bid)
            if loading is None:  # one read, however many of its trajectories were claimed at once
                loading = self._loading[bid] = asyncio.ensure_future(self._load_params(bid))
                loading.add_done_callback(lambda f: self._loaded(bid, f))
            req = await asyncio.shield(loading)
        else:
            self._params.move_to_end(bid)
        return Work(tid, bid, int(group), int(sample), _task(task), req)

    def _loaded(self, bid: str, f: asyncio.Future) -> None:
        del self._loading[bid]
        if not f.cancelled():
            f.exception()  # read here: a failed read's waiters each got its error already

    async def _load_params(self, bid: str) -> RolloutRequest:
        params = await self.r.hget(self.k.batch(bid), "params")
        req = RolloutRequest.model_validate({**json.loads(params), "tasks": [{}]})
        self._params[bid] = req
        if len(self._params) > PARAMS_CACHED:
            self._params.popitem(last=False)
        return req


def _totals(h: dict[str, str]) -> BatchTotals | None:
    """The batch's totals from its hash (the finishing script keeps them); None before they were."""
    if "sum:turns" not in h:
        return None
    rewarded = int(h.get("sum:rewarded", 0))
    return BatchTotals(
        turns=int(h["sum:turns"]), turned=int(h.get("sum:turned", 0)),
        sampled_tokens=int(h.get("sum:tokens:sampled", 0)), prompt_tokens=int(h.get("sum:tokens:prompt", 0)),
        rewarded=rewarded, mean_reward=float(h["sum:reward"]) / rewarded if rewarded else None,
        failures={k[len("failure:"):]: int(v) for k, v in h.items() if k.startswith("failure:")})
