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
decision's demand while there is work, and the measured step model under the engines' size
(`EngineInfo.gpus`) and model; roles move here, an engine's size only when it is launched again.
Engines of several sizes (a per-role launch) keep their roles as launched: the allocator's model
prices every engine alike.
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
                 measure: bool = False):
        """`measure`: teach the capacity from the turns workers report (`scheduler.timing`), so the
        allocator decides on measured rates; otherwise it keeps `capacity` (a prior) as given."""
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
        self._mixed_logged = False  # engines of several sizes: said once (their speed saved for none)
        self._sizes_logged = False  # ... and their roles left as launched: said once
        self._launch: tuple[str, int] | None = None  # (model, GPUs an engine) of the engines measured now

    def _sync(self, engines: dict[str, str], now: float, read_back: bool = False) -> Allocator:
        """(Re)build the allocator when the set of engines changes, starting from their roles.
        `read_back`: every engine reads a split turn's last response back (no recompute to charge)."""
        a = self.allocator
        if a is None or set(a.engines) != set(engines):
            # every engine here can serve every role, so a role is only routing: a move to decode or
            # mixed takes effect at once (a move to prefill still drains its decodes first); with two
            # engines, draining one toward decode would leave nothing decoding, so no split was reachable
            config = dataclasses.replace(self.config or AllocatorConfig(), response_kv_pushed=read_back,
                                         routing_only=True)
            a = Allocator(engines, self.capacity, config, Layout(0, 0, len(engines)), now)
            for eid, role in engines.items():  # each engine starts in its published role
                a.engines[eid] = EngineRole(eid)
                a.engines[eid].ready(now, Role(role))
            self.allocator = a
        return a

    async def step(self) -> list[Move]:
        now = self.clock()
        engines = await self.registry.engines()
        await self._follow_launch(engines)
        if self.measure:
            feed(self.capacity, await self.registry.take_timings())
        d = Demand.from_report(await self.registry.phases(), self.horizon_s)
        await self._record(engines, d)
        infos = [e for e in engines if self._switchable(e)]
        if not infos:
            return []
        if len({e.gpus for e in infos}) > 1:
            # a launch of two sizes (prefill engines at one TP, decode at another: `rollout launch-plan`)
            # keeps its roles as launched: the allocator prices every engine alike, and moving an
            # engine between the sizes' roles is a relaunch, not a move
            if not self._sizes_logged:
                self._sizes_logged = True
                log.warning("engines of several sizes: roles stay as launched (no allocation)",
                            extra={"sizes": sorted({e.gpus for e in infos})})
            return []
        self._sizes_logged = False
        fresh = self.allocator is None or set(self.allocator.engines) != {e.id for e in infos}
        a = self._sync({e.id: e.role for e in infos}, now, all(e.kv_read_back for e in infos))
        if fresh:  # drains an earlier allocator started: finish them toward their published next role
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

    async def _record(self, engines: list, d: Demand) -> None:
        """What launch planning reads (`rollout launch-plan`): each decision's demand while there is
        work, and the measured step model under the engines' size, where they all share one size
        and one model (a fit over engines of several sizes belongs to none of them)."""
        if d.live > 0 or d.prefill_tokens > 0:
            await self.registry.record_phase(d)
        kinds = {(e.model, e.gpus) for e in engines}
        if self.measure and self.capacity.samples and len(kinds) == 1:
            model, size = kinds.pop()
            await self.registry.save_profile(model, size, self.capacity)
        elif self.measure and len(kinds) > 1 and not self._mixed_logged:
            self._mixed_logged = True
            log.warning("engines of several models or sizes: their measured speed is saved for none "
                        "(launch planning)", extra={"kinds": sorted(f"{m}@{g}" for m, g in kinds)})

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
