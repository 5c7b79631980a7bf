"""The live prefill/decode allocation loop: forecasts in, engine roles out.

Every few seconds: sum the demand forecasts that rollout workers report (each worker runs
a `Lifecycle` + `Forecaster` over its own trajectories), read every engine's in-flight
tokens, let the same `Allocator` the simulator drives decide, and publish roles to the
registry. An engine being moved is published in state `draining`, so routers send it nothing
new; once its in-flight tokens reach zero it takes its new role. Workers follow the
registry within a refresh (2 s).

Run one per deployment (`rollout allocator`, or `rollout up --pd-allocation`). It moves only
engines that said they can serve every role (`EngineInfo.can_serve`, which workers detect from
each engine's KV connector: `kv_both` today, deprecated upstream); any other engine keeps its
role and is named in the log once, so nothing depends on `kv_both` silently.

Capacity: with `measure` (as `rollout allocator` runs it) the step model is fitted to the turns
workers report (`scheduler.timing`: vLLM's per-request prefill and decode seconds), so the
allocator reads measured rates; without it, the `Capacity` given (a prior) as it is.

It also keeps what launch planning needs (`scheduler.launch`, `rollout launch-plan`): each
decision's demand while there is work, and the measured step model under each engine size
(`EngineInfo.gpus`) and the model; roles move here, an engine's size only when it is launched again.
Engines of several sizes (a per-role launch: prefill engines of one GPU for decode engines of
eight) are measured size by size, each from the profile saved for it if any. They keep the roles
they were launched with unless `move_sizes` (`rollout allocator --move-sizes`): then the allocator
moves each engine between prefill and decode within its size (`Allocator(sizes=...)`). Off by
default: simulated over every per-role launch of the 32B on 8 GPUs (`benchmarks/pd_two_sizes.py`),
moving left the best launch of each workload as it was; over all 180 launch-cells it ran 1.15x
faster in geometric mean, but 0.75-0.98x in 17 of them (its estimate misjudges slow engines decoding).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable

from scheduler.allocator import Allocator, AllocatorConfig, Capacity, Layout, Move
from scheduler.connection import cancel_point
from scheduler.forecast import Demand
from scheduler.registry import Registry
from scheduler.roles import EngineRole, Role
from scheduler.timing import feed

log = logging.getLogger(__name__)

class PDController:
    def __init__(self, registry: Registry, capacity: Capacity | None = None, config: AllocatorConfig | None = None,
                 horizon_s: float = 10.0, drain_tok_s: float = 2_000.0, clock: Callable[[], float] = time.monotonic,
                 measure: bool = False, move_sizes: bool = False):
        """`measure`: teach the capacity from the turns workers report (`scheduler.timing`), so the
        allocator decides on measured rates; otherwise it keeps `capacity` (a prior) as given.
        `move_sizes`: move roles within each size where the engines are of several sizes (else
        they keep their roles as launched)."""
        self.registry = registry
        self.measure = measure
        if measure and capacity is None:
            capacity = Capacity()
        self.capacity, self.config = capacity, config
        self.horizon_s = horizon_s
        self.drain_tok_s = drain_tok_s  # assumed rate an engine works off its in-flight tokens
        self.clock = clock
        self.allocator: Allocator | None = None
        self._kept_out: set[str] = set()  # engines already logged as not switchable
        self.move_sizes = move_sizes
        self._mixed_logged = False  # engines of several models: said once (their speed saved for none)
        self._sizes_logged = False  # engines of several sizes kept in their roles: said once
        self._launch: tuple[str, int] | None = None  # (model, GPUs an engine) of the engines measured now
        # engines of several sizes (one model): each size's step model, measured on that size's engines
        self.capacities: dict[int, Capacity] = {}

    def _sync(self, engines: dict[str, str], sizes: dict[str, int], now: float, read_back: bool = False) -> Allocator:
        """(Re)build the allocator when the set of engines or their sizes change, starting from their
        roles. `sizes`: each engine's GPUs. `read_back`: every engine reads a split turn's last
        response back (no recompute to charge)."""
        several = sizes if len(set(sizes.values())) > 1 else None
        a = self.allocator
        if a is None or set(a.engines) != set(engines) or a.sizes != several:
            # every engine here can serve every role, so a role is only routing: a move to decode or
            # mixed takes effect at once (a move to prefill still drains its decodes first); with two
            # engines, draining one toward decode would leave nothing decoding, so no split was reachable
            config = dataclasses.replace(self.config or AllocatorConfig(), response_kv_pushed=read_back,
                                         routing_only=True)
            # one size allocated of several launched (the rest cannot switch): that size's own fit
            capacity = self.capacities.get(next(iter(sizes.values())), self.capacity) if not several else self.capacity
            a = Allocator(engines, capacity, config, Layout(0, 0, len(engines)), now, sizes=several,
                          capacities=self.capacities if several else None)
            for eid, role in engines.items():  # each engine starts in its published role
                a.engines[eid] = EngineRole(eid)
                a.engines[eid].ready(now, Role(role))
            self.allocator = a
        return a

    async def step(self) -> list[Move]:
        now = self.clock()
        engines = await self.registry.engines()
        await self._follow_sizes(engines)  # (first: back at one size, `_follow_launch` reloads its step model now)
        await self._follow_launch(engines)
        if self.measure:
            timings = await self.registry.take_timings()
            if self.capacities:  # each size learns from its own engines' turns
                size = {e.id: e.gpus for e in engines}
                for k, cap in self.capacities.items():
                    feed(cap, [t for t in timings if size.get(t.engine) == k])
            else:
                feed(self.capacity, timings)
        d = Demand.from_report(await self.registry.phases(), self.horizon_s)
        await self._record(engines, d)
        infos = [e for e in engines if self._switchable(e)]
        if not infos:
            return []
        if len({e.gpus for e in infos}) > 1 and not self.move_sizes:
            if not self._sizes_logged:
                self._sizes_logged = True
                log.warning("engines of several sizes: roles stay as launched (rollout allocator --move-sizes "
                            "moves them within each size)", extra={"sizes": sorted({e.gpus for e in infos})})
            return []
        self._sizes_logged = False
        before = self.allocator
        a = self._sync({e.id: e.role for e in infos}, {e.id: e.gpus for e in infos}, now,
                       all(e.kv_read_back for e in infos))
        if a is not before:  # drains an earlier allocator started: finish them toward their published next role
            for e in infos:
                if e.state != "draining":
                    continue
                if e.next_role in (None, e.role):  # no plan was published with it: serve the role it had
                    await self.registry.set_role(e.id, e.role)
                else:
                    a.engines[e.id].drain(Role(e.next_role), now)
        loads = await self.registry.engine_loads([e.id for e in infos])
        for eid in a.draining():
            if loads[eid][0] == 0:
                role = a.drained(eid, now)
                await self.registry.set_role(eid, role.value)
                log.info("engine switched role", extra={"engine": eid, "role": role.value})
        moves = a.allocate(d, {e: tokens / self.drain_tok_s for e, (tokens, _) in loads.items()}, now)
        for m in moves:
            if a.engines[m.engine].accepts:  # routing only: it serves the new role at once
                await self.registry.set_role(m.engine, m.new.value)
                log.info("engine switched role", extra={"engine": m.engine, "from": m.old.value, "to": m.new.value})
                continue
            await self.registry.drain(m.engine, m.new.value)
            log.info("engine draining for a new role", extra={"engine": m.engine, "from": m.old.value,
                                                              "to": m.new.value})
        return moves

    async def _follow_launch(self, engines: list) -> None:
        """The engines were launched again at another size (or with another model): measure the
        new launch afresh, from the step model saved for it if an earlier phase ran there (the
        fit so far describes the old engines). The first launch seen keeps the capacity given."""
        kinds = {(e.model, e.gpus) for e in engines}
        kind = next(iter(kinds)) if len(kinds) == 1 else None
        if not self.measure or kind is None or kind == self._launch:
            return
        if self._launch is not None:
            self.capacity = (await self.registry.profiles(kind[0])).get(kind[1]) or Capacity()
            self.allocator = None  # rebuilt on the new capacity
            log.info("engines launched at a new size: speed measured afresh", extra={
                "model": kind[0], "gpus": kind[1], "from_saved": self.capacity.samples > 0})
        self._launch = kind

    async def _follow_sizes(self, engines: list) -> None:
        """Engines of one model and several sizes: a step model per size, from the profile saved for
        it if an earlier phase ran there (measuring), else the capacity given (a prior, as it is)."""
        kinds = {(e.model, e.gpus) for e in engines}
        if len(kinds) < 2 or len({m for m, _ in kinds}) > 1:
            if self.capacities:  # back to one size: its step model comes from `_follow_launch`'s next look
                self.capacities, self._launch, self.allocator = {}, ("", 0), None
            return
        if set(self.capacities) != {g for _, g in kinds}:
            self.allocator = None  # rebuilt on the sizes' capacities
        for model, size in sorted(kinds):
            if size not in self.capacities:
                saved = (await self.registry.profiles(model)).get(size) if self.measure else None
                self.capacities[size] = saved or (Capacity() if self.measure else self.capacity)
        for size in set(self.capacities) - {g for _, g in kinds}:
            del self.capacities[size]

    async def _record(self, engines: list, d: Demand) -> None:
        """What launch planning reads (`rollout launch-plan`): each decision's demand while there is
        work, and the measured step model under each size, where the engines run one model (a fit
        over several models belongs to none of them)."""
        if d.live > 0 or d.prefill_tokens > 0:
            await self.registry.record_phase(d)
        kinds = {(e.model, e.gpus) for e in engines}
        if not self.measure or not kinds:
            return
        if len({m for m, _ in kinds}) > 1:
            if not self._mixed_logged:
                self._mixed_logged = True
                log.warning("engines of several models: their measured speed is saved for none (launch planning)",
                            extra={"kinds": sorted(f"{m}@{g}" for m, g in kinds)})
            return
        for model, size in kinds:
            cap = self.capacities.get(size, self.capacity) if self.capacities else self.capacity
            if cap.samples:
                await self.registry.save_profile(model, size, cap)

    def _switchable(self, e) -> bool:
        ok = e.can_serve is not None and {r.value for r in Role} <= set(e.can_serve)
        if not ok and e.id not in self._kept_out:
            self._kept_out.add(e.id)
            log.warning("engine kept out of allocation: it cannot serve every role",
                        extra={"engine": e.id, "can_serve": e.can_serve, "kv": e.kv or "not detected yet"})
        elif ok:
            self._kept_out.discard(e.id)
        return ok

    async def run(self, stop: asyncio.Event, every_s: float = 5.0) -> None:
        while not stop.is_set():
            try:
                await self.step()
            except Exception:  # one bad round must not stop allocation
                log.exception("allocation round failed")
            cancel_point()
            try:
                await asyncio.wait_for(stop.wait(), every_s)
            except TimeoutError:
                pass
