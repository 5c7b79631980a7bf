"""The engines a worker can use: discovered from the registry (or given), picked by a
routing policy, health-probed, with in-flight token accounting and failover.

An engine that fails a request or a health probe leaves rotation at once and returns when
a probe succeeds; if no healthy engine is left, failed ones are tried anyway (a flaky
engine beats none). A turn that fails on one engine is retried on another.

Engines carry a role (registry: prefill | decode | mixed). When the policy routes a turn's
prefill and decode to different engines, the prefill engine computes the KV and hands it
over through vLLM's `kv_transfer_params` protocol (NixlConnector); the decode engine samples.

A decode engine that keeps a finished turn's KV (vLLM's `bidirectional_kv_xfer`) answers with
`kv_transfer_params` for it; the fleet hands them to the trajectory's next prefill on another
engine, which reads that KV back instead of recomputing the last response (only what is new is
prefilled, as on a colocated engine). An engine's roles are asked of it once it is seen
(`capabilities`) and written to the registry, so an engine that cannot hand KV over or take it
is never silently given a role it cannot serve.

The registry is the one source of every engine's kind, role and policy version; the fleet
keeps a cache of it (`refresh`, every `refresh_s`), rebuilt from it at any time, and hands
the roles to the routing policy on each call. Engines are built by kind (`engines.make_engine`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator

from rollout_service.engines.base import (Engine, EngineError, EngineLost, EngineRejected, GenerateRequest,
                                          GenerateResult, TokenDelta)
from rollout_service.engines.kinds import make_engine
from rollout_service.tokens import Tokenizer, load_tokenizer, loaded_tokenizer
from scheduler.registry import Registry
from scheduler.roles import Role
from scheduler.router import NoEngine, RoleAware, RoutingPolicy
from scheduler.timing import TurnTiming
from wire import EngineInfo

log = logging.getLogger(__name__)

# An engine holding pushed weights is asked its process start time (a `/metrics` read) at least
# this often besides when it comes back from down: one read per worker per engine per period.
WEIGHTS_CHECK_S = 10.0

# An engine found failing is left out of rotation this long, unless a probe finds it up sooner. A
# process that probes (a rollout worker, every 2 s) finds a dead engine down again at each probe;
# one that does not (the gateway's session proxy) gave up on an engine for good after one failure.
DOWN_S = 10.0


async def started_at(engine: Engine) -> float | None:
    """The engine process's start time, where its kind can tell (None otherwise)."""
    ask = getattr(engine, "started_at", None)
    return await ask() if ask is not None else None


def restarted(info: EngineInfo, started: float | None) -> bool:
    """Whether the engine's process started after its last weight update loaded: it no longer
    holds those weights. False where either start time is unknown (nothing to compare)."""
    w = info.weights
    return w is not None and w.engine_started_at is not None and started is not None and \
        started > w.engine_started_at


class Fleet:
    def __init__(self, engines: dict[str, tuple[Engine, str]] | None = None,
                 policy: RoutingPolicy | None = None, attempts: int = 3,
                 registry: Registry | None = None, refresh_s: float = 2.0, read_back: bool = True):
        """`engines`: id -> (engine, tokenizer spec), fixed; or `registry` to discover them.
        `read_back=False`: a split turn's prefill recomputes the last response (as before the
        decode engines kept it), for comparison."""
        self._engines: dict[str, tuple[Engine, str]] = dict(engines or {})
        self._infos: dict[str, EngineInfo] = {}  # what each registry-built engine was built from
        self.policy = policy or RoleAware()
        self._roles: dict[str, Role] = {e: Role.mixed for e in self._engines}  # taking new work; cache of the registry
        self.attempts = attempts
        self._registry = registry
        self._refresh_s = refresh_s
        self._refreshed = 0.0
        self._load: dict[str, int] = {e: 0 for e in self._engines}
        self._down: dict[str, float] = {}  # engine -> when it was last found failing
        # engine -> (the process start time its pushed weights were loaded at, when that was last
        # checked against the engine's own) (`_holds_weights`)
        self._weights_checked: dict[str, tuple[float, float]] = {}
        self._stale: set[str] = set()  # engines found without their pushed weights
        # trajectory -> (decode engine, the kv_transfer_params it answered): its last turn's KV,
        # held there for the next prefill to read; bounded, oldest dropped first
        self._held: dict[str, tuple[str, dict]] = {}
        self._max_held = 100_000
        self.read_back = read_back
        self._inflight: dict[str, int] = {}  # requests this process has on each engine (a batch size, for timings)

    @property
    def engine_ids(self) -> list[str]:
        return sorted(self._engines)

    @property
    def down(self) -> frozenset[str]:
        return frozenset(e for e in self._down if self._is_down(e))

    def _is_down(self, eid: str) -> bool:
        at = self._down.get(eid)
        return at is not None and time.monotonic() - at < DOWN_S

    def _mark_down(self, eid: str) -> None:
        self._down[eid] = time.monotonic()

    async def refresh(self, force: bool = False) -> None:
        if self._registry is None or (not force and time.monotonic() - self._refreshed < self._refresh_s):
            return
        infos = await self._registry.engines()
        self._refreshed = time.monotonic()
        for info in infos:
            cur = self._infos.get(info.id)
            if cur is None or (cur.kind, cur.url, cur.model, cur.tokenizer) != (
                    info.kind, info.url, info.model, info.tokenizer):
                try:
                    engine = make_engine(info)
                except ValueError as e:  # a kind this process does not know: not ours to use
                    log.warning("engine %s skipped: %s", info.id, e)
                    continue
                if info.id in self._engines:
                    await self._engines[info.id][0].aclose()
                self._down.pop(info.id, None)  # registered anew (another URL or tokenizer): judged afresh
                self._engines[info.id], self._infos[info.id] = (engine, info.tokenizer), info
                self._load.setdefault(info.id, 0)
            self._engines[info.id][0].policy_version = info.policy_version
            self._infos[info.id] = info
            if info.state == "draining":  # finishing what it holds before a new role: nothing new
                self._roles.pop(info.id, None)
            elif info.can_serve is not None and info.role not in info.can_serve:
                # a role its KV connector does not allow (set by hand, or before detection): serve
                # colocated, and say so (`rollout engines` shows what it can serve)
                if self._roles.get(info.id) is not Role.mixed:
                    log.warning("engine %s cannot serve role %s (%s): serving mixed", info.id, info.role, info.kv)
                self._roles[info.id] = Role.mixed
            else:
                self._roles[info.id] = Role(info.role)
        for gone in set(self._engines) - {i.id for i in infos if i.id in self._infos}:
            eng, _ = self._engines.pop(gone)
            self._infos.pop(gone, None)
            self._down.pop(gone, None)
            self._roles.pop(gone, None)
            self._weights_checked.pop(gone, None)
            self._stale.discard(gone)
            await eng.aclose()

    def serves_turns(self) -> bool:
        """Some engine takes new prefills and some takes decodes: with none registered, or only
        prefill engines (a role set by hand, engines registered one by one), no turn can run (nor
        on an engine that restarted without its pushed weights: `_holds_weights`)."""
        roles = [self._roles[e] for e in self._engines if e in self._roles and e not in self._stale]
        return any(r.prefills for r in roles) and any(r.decodes for r in roles)

    @property
    def stale(self) -> frozenset[str]:
        """Engines the last probes found restarted without their pushed weights (`_holds_weights`)."""
        return frozenset(self._stale)

    @property
    def roles(self) -> dict[str, Role]:
        """The role of each engine taking new work (draining ones are absent)."""
        return dict(self._roles)

    async def probe(self) -> None:
        """Health-check every engine; a failing one leaves rotation until it answers again."""
        await self.refresh(force=True)
        ids = list(self._engines)
        ok = await asyncio.gather(*(self._engines[e][0].health() for e in ids), return_exceptions=True)
        for eid, healthy in zip(ids, ok):
            if healthy is not True:
                self._mark_down(eid)
                continue
            back = self._down.pop(eid, None) is not None
            if back:  # perhaps restarted with another context
                forget = getattr(self._engines[eid][0], "forget_context", None)
                if forget is not None:
                    forget()
            if not await self._holds_weights(eid, back):
                self._mark_down(eid)
        await self._detect([e for e in ids if not self._is_down(e) and e in self._infos and self._infos[e].kv is None])

    async def _holds_weights(self, eid: str, back: bool) -> bool:
        """False if the engine restarted since its last weight update loaded (it serves the weights
        it was launched with, under the version pushed since): no turn runs on it until a gateway's
        `WeightKeeper` loads them again. Asked when first seen, when back from down (a restart
        takes a vLLM server away for longer than a probe's period: it loads its model), while it
        does not hold them, and every WEIGHTS_CHECK_S besides (a restart quicker than a probe's
        period: turns may run on it until then)."""
        info = self._infos.get(eid)
        loaded_at = info.weights.engine_started_at if info is not None and info.weights is not None else None
        checked = self._weights_checked.get(eid)
        if loaded_at is None or (not back and eid not in self._stale and checked is not None and
                                 checked[0] == loaded_at and time.monotonic() - checked[1] < WEIGHTS_CHECK_S):
            return True
        try:
            started = await started_at(self._engines[eid][0])
        except EngineError:
            return False
        if restarted(info, started):
            if eid not in self._stale:
                log.warning("engine %s restarted without its pushed weights (policy version %d): no turn runs "
                            "on it until they are loaded again", eid, info.policy_version)
                self._stale.add(eid)
            return False
        self._stale.discard(eid)
        self._weights_checked[eid] = (loaded_at, time.monotonic())
        return True

    async def _detect(self, ids: list[str]) -> None:
        """Ask engines not asked yet which roles they can serve; record it in the registry."""
        for eid in ids:
            ask = getattr(self._engines[eid][0], "capabilities", None)
            if ask is None or self._registry is None:
                continue
            try:
                caps = await ask()
                info = await self._registry.set_capabilities(
                    eid, list(caps.can_serve) if caps.can_serve is not None else None, caps.kv, caps.reads_back)
            except (EngineError, KeyError) as e:  # down or removed meanwhile: the next probe asks again
                log.info("engine %s: roles not detected yet: %s", eid, e)
                continue
            self._infos[eid] = info
            log.info("engine %s can serve %s (%s)", eid, caps.can_serve, caps.kv)

    def loads(self) -> dict[str, int]:
        """In-flight tokens (prompt + max new) this process has on each engine."""
        return {e: self._load.get(e, 0) for e in self._engines}

    def _available(self, tokenizer: str | None) -> dict[str, int]:
        able = {e: self._load.get(e, 0) for e, (_, tok) in self._engines.items()
                if (tokenizer is None or tok == tokenizer) and e not in self._stale}  # (never, even if alone)
        if not self._down:  # (every turn comes here twice: no clock read while nothing failed)
            return able
        recent = time.monotonic() - DOWN_S
        healthy = {e: n for e, n in able.items() if self._down.get(e, recent) <= recent}
        return healthy or able

    async def tokenizer_for(self, trajectory_id: str) -> tuple[str, Tokenizer]:
        """The tokenizer of the engine a new trajectory will start on."""
        spec, tok, _ = await self.chat_for(trajectory_id)
        return spec, tok

    async def chat_for(self, trajectory_id: str) -> tuple[str, Tokenizer, str]:
        """The tokenizer spec, tokenizer and tool parser name of the engine a trajectory starts on.
        An engine registered with a tokenizer that cannot be loaded is left out (as a failing one
        is) and the next is tried: one bad registration took every new session to that engine."""
        await self.refresh()
        failed: list[str] = []
        for _ in range(max(len(self._engines), 1)):
            try:
                eid = self.policy.route(trajectory_id, self._available(None), self._roles)[0]
            except NoEngine as e:  # none registered, or none that takes prefills (or decodes)
                self._raise_if_stale()
                raise EngineError(str(e) if self._engines else "no engine registered") from e
            spec = self._engines[eid][1]
            parser = self._infos[eid].tool_parser if eid in self._infos else "hermes"
            tok = loaded_tokenizer(spec)  # at hand almost always: no thread for it
            try:
                return spec, tok if tok is not None else await asyncio.to_thread(load_tokenizer, spec), parser
            except Exception as e:  # not a registered name nor a loadable tokenizer folder
                why = f"engine {eid}: tokenizer {spec!r} cannot be loaded ({type(e).__name__}: {e})"
                if why not in failed:
                    log.warning("%s; trying another engine", why)
                    failed.append(why)
                self._mark_down(eid)
                self.policy.forget(trajectory_id)
        raise EngineError("; ".join(failed))

    async def generate(self, trajectory_id: str, tokenizer: str, req: GenerateRequest,
                       new_tokens: int | None = None) -> GenerateResult:
        """Serve one turn, failing over to another engine (same tokenizer) on error.
        `new_tokens`: how much of the prompt is new this turn (the rest was the engine's last
        time), for the timing the allocator measures speed from; default: all of it."""
        new_tokens = len(req.prompt_ids) if new_tokens is None else new_tokens
        last: Exception | None = None
        for _ in range(self.attempts):
            pid, eid = await self._route(trajectory_id, tokenizer, last)
            engine, _ = self._engines[eid]
            cost = len(req.prompt_ids) + req.sampling.max_tokens
            self._load[eid] = self._load.get(eid, 0) + cost
            self._inflight[eid] = batch = self._inflight.get(eid, 0) + 1
            failed = pid
            try:
                t0 = time.perf_counter()
                held = self._held.pop(trajectory_id, None)
                if pid != eid:  # disaggregated: prefill on pid, KV handed over, decode on eid
                    self._load[pid] = self._load.get(pid, 0) + len(req.prompt_ids)
                    # the last turn's KV, kept by the engine that decoded it: read back, not recomputed
                    back = held[1] if held is not None and held[0] != pid else None
                    try:
                        params = await self._engines[pid][0].prefill(dataclasses.replace(req, kv_transfer_params=back))
                    finally:
                        self._load[pid] -= len(req.prompt_ids)
                    t_prefill, failed = time.perf_counter() - t0, eid
                    res = await engine.generate(dataclasses.replace(req, kv_transfer_params=params))
                    res.prefill_s = t_prefill
                    if res.kv_transfer_params and self.read_back:
                        self._hold(trajectory_id, eid, res.kv_transfer_params)
                else:
                    failed = eid
                    res = await engine.generate(req)
            except EngineRejected:  # this request, not the engine: no other engine would take it
                raise
            except EngineError as e:
                last = e
                self._mark_down(failed)
                self.policy.forget(trajectory_id)
                continue
            finally:
                self._load[eid] -= cost
                self._inflight[eid] -= 1
            if self._registry is not None:
                await self._report(TurnTiming(eid, new_tokens, len(req.prompt_ids), len(res.output_ids), res.prefill_s,
                                              res.decode_s, batch, pid != eid))
            await self._label(eid, engine, res)
            return res
        kind = EngineLost if isinstance(last, EngineLost) else EngineError  # every engine unreachable: ours
        raise kind(f"turn failed on {self.attempts} engine attempts: {last}")

    async def _route(self, trajectory_id: str, tokenizer: str, last: Exception | None) -> tuple[str, str]:
        """(prefill engine, decode engine) for the next try of a turn; the same id when colocated."""
        await self.refresh()
        try:
            pid, eid = self.policy.route(trajectory_id, self._available(tokenizer), self._roles)
        except NoEngine as e:
            self._raise_if_stale()
            why = f" (the last attempt: {last})" if last is not None else ""  # what took the others out
            raise EngineError(f"no engine available for tokenizer {tokenizer!r}{why}") from (last or e)
        if pid != eid and self._roles.get(pid) is Role.mixed and not self._hands_over(pid, eid):
            return pid, pid  # a crowded mixed engine's decode moves only where KV can follow it
        return pid, eid

    def _raise_if_stale(self) -> None:
        """No engine to route to while some restarted without their pushed weights: ours, not the
        trajectory's (EngineLost: restarted, uncharged, once a gateway loaded them again)."""
        if self._stale:
            raise EngineLost(f"engines {', '.join(sorted(self._stale))} restarted: their pushed weights are "
                             "being loaded again")

    def _hands_over(self, pid: str, eid: str) -> bool:
        """Both engines' KV connectors are known to allow a split turn (prefill here, decode there)."""
        p, d = self._infos.get(pid), self._infos.get(eid)
        return (p is not None and d is not None and "prefill" in (p.can_serve or ())
                and "decode" in (d.can_serve or ()))

    async def stream(self, trajectory_id: str, tokenizer: str,
                     req: GenerateRequest) -> AsyncIterator[TokenDelta | GenerateResult]:
        """`generate`, streamed (`Engine.stream`). It fails over to another engine only while
        no token has been handed on: after that a new engine would sample other tokens than
        the ones already out, so a failure ends the stream with the error."""
        last: Exception | None = None
        for _ in range(self.attempts):
            pid, eid = await self._route(trajectory_id, tokenizer, last)
            engine, _ = self._engines[eid]
            cost = len(req.prompt_ids) + req.sampling.max_tokens
            self._load[eid] = self._load.get(eid, 0) + cost
            failed, started, one = pid, False, req
            try:
                t0 = time.perf_counter()
                if pid != eid:  # disaggregated: the prefill whole on pid, the decode streamed from eid
                    self._load[pid] = self._load.get(pid, 0) + len(req.prompt_ids)
                    try:
                        one = dataclasses.replace(req, kv_transfer_params=await self._engines[pid][0].prefill(req))
                    finally:
                        self._load[pid] -= len(req.prompt_ids)
                t_prefill, failed = time.perf_counter() - t0, eid
                async for ev in engine.stream(one):
                    if isinstance(ev, GenerateResult):
                        if pid != eid:
                            ev.prefill_s = t_prefill
                        await self._label(eid, engine, ev)
                        yield ev
                        return
                    started = True
                    yield ev
                raise EngineError(f"engine {eid} ended its stream without a result")
            except EngineRejected:
                raise
            except EngineError as e:
                self._mark_down(failed)
                self.policy.forget(trajectory_id)
                if started:
                    raise
                last = e
            finally:
                self._load[eid] -= cost
        kind = EngineLost if isinstance(last, EngineLost) else EngineError
        raise kind(f"turn failed on {self.attempts} engine attempts: {last}")

    async def _label(self, eid: str, engine: Engine, res: GenerateResult) -> None:
        if self._registry is not None:
            # Label the turn with the version serving when it finished: a weight update
            # pauses engines mid-request and resumes them on the new weights.
            info = await self._registry.engine(eid)
            if info is not None and info.policy_version != res.policy_version:
                engine.policy_version = res.policy_version = info.policy_version

    async def _report(self, timing: TurnTiming) -> None:
        try:
            await self._registry.report_timing(timing)
        except Registry.unavailable:  # a measurement lost to a Redis outage, never the turn
            pass

    def _hold(self, trajectory_id: str, engine_id: str, params: dict) -> None:
        if len(self._held) >= self._max_held:
            self._held.pop(next(iter(self._held)))
        self._held[trajectory_id] = (engine_id, params)

    def forget(self, trajectory_id: str) -> None:
        self.policy.forget(trajectory_id)
        self._held.pop(trajectory_id, None)

    async def aclose(self) -> None:
        for eng, _ in self._engines.values():
            await eng.aclose()
