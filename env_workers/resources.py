"""Typed resource pools: sandboxes, engines and external APIs, leased per trajectory.

    pools = Pools(PoolSize(warm=4, cap=64, wait_s=10.0))
    pools.prewarm(SANDBOX)                       # fill the warm set in the background
    box = pools.acquire("traj-1", SANDBOX)       # on the first tool call: warm -> acquired(traj-1)
    assert pools.acquire("traj-1", SANDBOX) is box   # every later turn: the same resource
    pools.release("traj-1")                      # episode over: destroyed, or reset -> warm
    pools.close()

A resource is described by a `ResourceSpec`: a frozen (hashable) dataclass that says what it
is (`kind`), how long it lives (`scope`) and how to `create`, `reset` and `destroy` one. One
`Pool` serves each distinct spec, so two different specs in one trajectory get two resources
and equal specs share a pool. Scopes:

- `trajectory`: destroyed when its trajectory releases it (a sandbox the agent has written to);
- `global`: reset and returned to the warm set (a sandbox wiped clean, an API slot).

Every resource follows one state machine (illegal transitions raise `IllegalTransition`):

    warm ──acquire──▶ acquired(owner) ──release──▶ reset ──▶ warm     (scope global)
      │                    │                         └─────▶ destroyed (reset failed)
      └──close──▶ destroyed ◀──release (scope trajectory), close

Bounds: each pool keeps `warm` idle resources ready (refilled by a small background
executor), never holds more than `cap` at once, and an `acquire` that finds the pool at its
cap waits at most `wait_s`, then raises `ResourceExhausted` (backpressure, never an unbounded
wait). A `create` that fails raises `ResourceFailed`; the pool's count is given back.

Non-goals: what a resource *is* (sandboxes are `env_workers/sandbox/pool.py`), fairness
between owners waiting on one pool (first woken wins), and sharing pools across processes
(each env worker owns its pools).

Errors:

    ResourceError
    ├── ResourceExhausted     every resource of the spec is in use and none freed up in time
    ├── ResourceFailed        the spec's create() raised: an infrastructure failure
    └── IllegalTransition     a bug: a resource was moved along an edge the machine lacks
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol


class ResourceKind(str, Enum):
    sandbox = "sandbox"
    engine = "engine"
    api = "api"


class Scope(str, Enum):
    trajectory = "trajectory"  # destroyed at the end of the episode
    global_ = "global"         # reset and returned to the pool


class ResourceState(str, Enum):
    warm = "warm"
    acquired = "acquired"
    reset = "reset"
    destroyed = "destroyed"


S = ResourceState
TRANSITIONS: dict[ResourceState, frozenset[ResourceState]] = {
    S.warm: frozenset({S.acquired, S.destroyed}),
    S.acquired: frozenset({S.reset, S.destroyed}),
    S.reset: frozenset({S.warm, S.destroyed}),
    S.destroyed: frozenset(),
}


class ResourceError(Exception):
    pass


class ResourceExhausted(ResourceError):
    pass


class ResourceFailed(ResourceError):
    pass


class IllegalTransition(ResourceError):
    pass


class ResourceSpec(Protocol):
    """What a pool serves. Implementations are frozen dataclasses: equal specs share a pool."""

    kind: ResourceKind
    scope: Scope

    def create(self) -> Any: ...

    def reset(self, value: Any) -> None: ...  # make it as good as new; raise to have it destroyed

    def destroy(self, value: Any) -> None: ...


@dataclass(slots=True, frozen=True)
class PoolSize:
    warm: int = 2          # idle resources kept ready per spec
    cap: int = 32          # most resources of one spec alive at once (idle + acquired + starting)
    wait_s: float = 30.0   # longest an acquire waits at the cap before ResourceExhausted


@dataclass(slots=True, eq=False)
class Resource:
    spec: ResourceSpec
    value: Any
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    state: ResourceState = ResourceState.warm
    owner: str | None = None
    uses: int = 0

    def to(self, new: ResourceState, owner: str | None = None) -> None:
        if new not in TRANSITIONS[self.state]:
            raise IllegalTransition(f"{self.spec.kind.value} {self.id} cannot go from {self.state.value} to {new.value}")
        self.state, self.owner = new, owner
        if new is ResourceState.acquired:
            self.uses += 1


class Pool:
    """The resources of one spec. Thread-safe; `take` and `give` are its two verbs."""

    def __init__(self, spec: ResourceSpec, size: PoolSize, warmer: ThreadPoolExecutor) -> None:
        self.spec, self.size, self._warmer = spec, size, warmer
        self._idle: deque[Resource] = deque()
        self._live = 0      # idle + acquired + being created or reset
        self._warming = 0   # background creations in flight
        self._closed = False
        self._cond = threading.Condition()

    def stats(self) -> dict[str, int]:
        with self._cond:
            return {"idle": len(self._idle), "live": self._live, "warming": self._warming,
                    "acquired": self._live - len(self._idle) - self._warming}

    def take(self, owner: str, wait_s: float | None = None) -> Resource:
        deadline = time.monotonic() + (self.size.wait_s if wait_s is None else wait_s)
        with self._cond:
            while True:
                if self._closed:
                    raise ResourceFailed(f"the {self.spec.kind.value} pool is closed")
                if self._idle:
                    r = self._idle.popleft()
                    r.to(ResourceState.acquired, owner)
                    self._refill_locked()
                    return r
                if self._live < self.size.cap:
                    self._live += 1
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ResourceExhausted(
                        f"all {self.size.cap} {self.spec.kind.value} resources of {self.spec} are in use; "
                        f"waited {self.size.wait_s if wait_s is None else wait_s:g}s")
                self._cond.wait(left)
        r = self._create()  # cold: outside the lock, counted in _live already
        r.to(ResourceState.acquired, owner)
        with self._cond:
            self._refill_locked()
        return r

    def give(self, r: Resource) -> None:
        if self.spec.scope is Scope.global_:
            r.to(ResourceState.reset)
            try:
                self.spec.reset(r.value)
            except Exception:  # noqa: BLE001 - a resource that cannot be reset is destroyed
                self._destroy(r)
                return
            with self._cond:
                if not self._closed:
                    r.to(ResourceState.warm)
                    self._idle.append(r)
                    self._cond.notify()
                    return
        self._destroy(r)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            idle, self._idle = list(self._idle), deque()
            self._cond.notify_all()
        for r in idle:
            self._destroy(r)

    # -- internals -------------------------------------------------------------------------

    def _create(self) -> Resource:
        try:
            return Resource(self.spec, self.spec.create())
        except Exception as e:
            with self._cond:
                self._live -= 1
                self._cond.notify()
            raise ResourceFailed(f"could not create a {self.spec.kind.value} for {self.spec}: {e}") from e

    def _destroy(self, r: Resource) -> None:
        r.to(ResourceState.destroyed)
        try:
            self.spec.destroy(r.value)
        finally:
            with self._cond:
                self._live -= 1
                self._cond.notify()
                self._refill_locked()

    def _refill_locked(self) -> None:
        if self._closed:
            return
        need = self.size.warm - len(self._idle) - self._warming
        while need > 0 and self._live < self.size.cap:
            self._live += 1
            self._warming += 1
            need -= 1
            try:
                self._warmer.submit(self._warm_one)
            except RuntimeError:  # the executor is shutting down
                self._live -= 1
                self._warming -= 1
                return

    def _warm_one(self) -> None:
        try:
            r = self._create()
        except ResourceFailed:
            with self._cond:
                self._warming -= 1
            return  # the next acquire creates one cold and reports the failure
        with self._cond:
            self._warming -= 1
            if not self._closed:
                self._idle.append(r)
                self._cond.notify()
                return
        self._destroy(r)


class Pools:
    """All pools of one process, keyed by spec, and who holds what.

    `acquire(owner, spec)` returns the owner's resource of that spec, taking one from the
    pool the first time; `release(owner)` gives back everything the owner holds. Both are
    idempotent in the way an episode needs: acquire again, same resource; release twice, no-op.
    """

    def __init__(self, size: PoolSize | None = None, sizes: dict[ResourceKind, PoolSize] | None = None,
                 warm_threads: int = 2) -> None:
        self._size, self._sizes = size or PoolSize(), sizes or {}
        self._pools: dict[ResourceSpec, Pool] = {}
        self._held: dict[str, dict[ResourceSpec, Resource]] = {}
        self._owner_locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._warmer = ThreadPoolExecutor(warm_threads, thread_name_prefix="resource-warm")
        self._closed = False

    def pool(self, spec: ResourceSpec) -> Pool:
        with self._lock:
            if self._closed:
                raise ResourceFailed("the pools are closed")
            p = self._pools.get(spec)
            if p is None:
                p = self._pools[spec] = Pool(spec, self._sizes.get(spec.kind, self._size), self._warmer)
            return p

    def prewarm(self, spec: ResourceSpec) -> None:
        p = self.pool(spec)
        with p._cond:
            p._refill_locked()

    def acquire(self, owner: str, spec: ResourceSpec, wait_s: float | None = None) -> Any:
        with self._lock:
            lock = self._owner_locks.setdefault(owner, threading.Lock())
        with lock:  # one owner acquiring one spec from two threads still gets one resource
            held = self._held.get(owner, {})
            if spec in held:
                return held[spec].value
            r = self.pool(spec).take(owner, wait_s)
            with self._lock:
                self._held.setdefault(owner, {})[spec] = r
            return r.value

    def held(self, owner: str) -> list[Resource]:
        with self._lock:
            return list(self._held.get(owner, {}).values())

    def release(self, owner: str) -> None:
        with self._lock:
            held = self._held.pop(owner, {})
            self._owner_locks.pop(owner, None)
        errors = []
        for r in held.values():
            try:
                self._pools[r.spec].give(r)
            except Exception as e:  # noqa: BLE001 - give back the rest before reporting
                errors.append(e)
        if errors:
            raise ResourceFailed(f"releasing {owner}'s resources: {errors[0]}") from errors[0]

    def claims(self, owner: str | None = None) -> "Claims":
        return Claims(self, owner or uuid.uuid4().hex)

    def stats(self) -> dict[str, dict[str, int]]:
        with self._lock:
            pools = list(self._pools.items())
        return {f"{s.kind.value}:{s}": p.stats() for s, p in pools}

    def close(self) -> None:
        """Destroy every resource, held or idle (the process is going away)."""
        with self._lock:
            self._closed = True
            owners = list(self._held)
        for o in owners:
            try:
                self.release(o)
            except ResourceFailed:
                pass
        self._warmer.shutdown(wait=True)
        for p in list(self._pools.values()):
            p.close()


@dataclass(slots=True)
class Claims:
    """One trajectory's view of the pools: what an environment is handed per episode."""

    pools: Pools
    owner: str

    def acquire(self, spec: ResourceSpec, wait_s: float | None = None) -> Any:
        return self.pools.acquire(self.owner, spec, wait_s)

    def release(self) -> None:
        self.pools.release(self.owner)

    @property
    def held(self) -> list[Resource]:
        return self.pools.held(self.owner)
