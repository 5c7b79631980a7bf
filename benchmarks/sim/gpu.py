"""One simulated GPU engine with continuous batching, advanced as a fluid between events.

Between two events the engine's composition is fixed, so every decoding sequence gains one
token per iteration of length τ (`ClusterCost.step_time`) and the prefill queue gains k tokens
per iteration (k = what is queued, up to the step's token budget: several prefills share a
step, as in vLLM; the fluid credits them to the head first). A step's prefill attention is
costed at the head's prefix (cached tokens + what it has prefilled), refreshed every chunk. Decoding progress is kept as one virtual counter V (tokens per
sequence), so a sequence's completion is an O(log B) heap entry rather than a per-step event.
τ grows with context as sequences decode; it is re-evaluated at least every `REFRESH_STEPS`.

A decode joins only when its context fits in the KV capacity (else it waits, FIFO). The
engine's prefix cache (`hit`/`touch`: trajectory -> tokens) decides how much of a turn must be
prefilled here, and how much KV must be transferred in for a decode. It shares the KV
capacity with running sequences and evicts least-recently-used prefixes of trajectories that
are not running here (e.g. waiting on a tool), so a long tool call under memory pressure
costs a full recompute (or a full transfer) on the next turn.

Non-goals: the role (the router and allocator decide what is sent here), preemption.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Callable

from benchmarks.sim.clock import EventLoop
from benchmarks.sim.cost import ClusterCost

REFRESH_STEPS = 256  # context growth over this many steps changes τ by a few percent at most
_EPS = 1e-6
STEP_MEMORY_S = 10.0  # how far back `pace_s` looks (a few hundred decode steps)
STEP_KINDS = ("decode", "mixed", "prefill")  # what an engine's steps carry: decodes, decodes beside a chunk, a chunk


class SimGPU:
    def __init__(self, id: str, cost: ClusterCost, loop: EventLoop,
                 prefilled: Callable[["SimGPU", str], None], decoded: Callable[["SimGPU", str], None],
                 measure: Callable[[int, float, float, float, float], None] | None = None):
        self.id, self.cost, self.loop = id, cost, loop
        self._prefilled, self._decoded, self._measure = prefilled, decoded, measure
        self._cache: OrderedDict[str, int] = OrderedDict()  # LRU: oldest first
        self._cache_total = 0
        self._pf_tids: dict[str, int] = {}  # trajectories with a prefill queued here (pinned)
        self.incoming = 0  # KV transfers on their way here
        self.incoming_tokens = 0  # ... and the tokens they bring (counted in `load`: the router has sent them)
        self._t = 0.0
        self._v = 0.0  # tokens each running sequence has gained since the engine started
        self._tau = 0.0
        # seconds a decode step has taken lately, prefill chunks included (decaying sums over
        # `STEP_MEMORY_S` of decoding time): the pace a sequence decodes at, where `_tau` is only the
        # step running now (a 2,048-token chunk's step is 10-30x a decode step)
        self._pace_t = self._pace_v = 0.0
        self._pf_rate = 0.0
        self._heap: list[tuple[float, int, str]] = []  # (finish V, seq, trajectory)
        self._seqs: dict[str, tuple[float, int]] = {}  # trajectory -> (V at join, context at join)
        self._finish: dict[str, float] = {}  # trajectory -> V at which it finishes
        self._s = 0.0  # Σ(context at join − V at join): context now = _s + B·V
        self._n = 0
        self._prefill: deque[list] = deque()  # [trajectory, tokens left, context when done]
        self._pf_left = 0.0
        self._wait: deque[tuple[str, int, int]] = deque()  # (trajectory, context, tokens) awaiting KV room
        self._wait_ctx = 0
        self._version = 0
        self.busy_s = 0.0
        self.prefilled_tokens = 0
        # by kind of step (decode only, mixed: decodes beside a chunk, prefill only): [seconds,
        # tokens decoded, tokens prefilled, sequence-seconds (their mean batch: / seconds)]
        self.steps: dict[str, list[float]] = {k: [0.0, 0.0, 0.0, 0.0] for k in STEP_KINDS}

    # --- what the cluster reads ---------------------------------------------------------
    def context(self) -> float:
        return self._s + len(self._seqs) * self._v

    def load(self) -> int:
        """In-flight tokens now: prefill left, KV held, KV waiting, and KV on its way here (routed here:
        the live fleet charges an engine when it sends the request). Projected to the clock without
        advancing the fluid, so reading it changes nothing (the router reads it between events)."""
        dt = self.loop.now - self._t
        n = len(self._seqs)
        pf, ctx = self._pf_left, self._s + n * self._v  # (`context()`, inline: the router reads every engine's)
        if dt > 0:
            if self._prefill:
                pf -= dt * self._pf_rate
            if n:
                ctx += n * dt / self._tau
        return int(pf + ctx + self._wait_ctx + self.incoming_tokens)

    def queued_prefill(self) -> float:
        """Prefill tokens queued here, as of the last event."""
        return self._pf_left

    def empty(self) -> bool:
        return not self._prefill and not self._seqs and not self._wait and self.incoming == 0

    def drain_s(self) -> float:
        """Seconds to finish what the engine holds once it takes nothing new: the queued prefill,
        then the longest decode at a decode-only step's pace (a draining engine's steps carry no
        new chunks: at the current pace, a colocated engine's prefill-stalled steps made drains
        look up to 10x longer than they are)."""
        pf = self._pf_left / self.cost.prefill_tokens_per_s
        if not self._seqs:
            return pf + (0.5 if self._wait or self.incoming else 0.0)
        longest = max(f for f, _, _ in self._heap) - self._v
        return pf + longest * self.cost.step_time(len(self._seqs), self.context())

    # --- work in ----------------------------------------------------------------------
    def add_prefill(self, tid: str, tokens: int, prefix: int = 0) -> None:
        """Prefill `tokens` after `prefix` tokens this engine has cached."""
        self._advance()
        work = tokens + self.cost.prefill_overhead_s * self.cost.prefill_tokens_per_s
        self._prefill.append([tid, work, prefix + work])
        self._pf_tids[tid] = self._pf_tids.get(tid, 0) + 1
        self._pf_left += work
        self.prefilled_tokens += tokens
        self._reschedule()

    def add_decode(self, tid: str, context: int, tokens: int) -> None:
        self._advance()
        self._wait.append((tid, context, tokens))
        self._wait_ctx += context
        self._admit()
        self._reschedule()

    def forget(self, tid: str) -> None:
        self._cache_total -= self._cache.pop(tid, 0)

    def flush(self) -> None:
        """Drop the prefix cache (a role switch that restarts the engine)."""
        self._cache.clear()
        self._cache_total = 0

    def remaining(self, tid: str) -> tuple[float, float]:
        """(tokens the trajectory still has to decode here, seconds a step takes at the recent pace)."""
        f = self._finish.get(tid)
        if f is None:
            return 0.0, self.cost.decode_step_s
        v = self._v + max(self.loop.now - self._t, 0.0) / self._tau  # projected: reading changes nothing
        return max(f - v, 0.0), self.pace_s()

    def pace_s(self) -> float:
        """Seconds a decode step has taken over the last `STEP_MEMORY_S` of decoding (chunked
        steps included), or the step running now if nothing has decoded yet."""
        step = self._pace_t / self._pace_v if self._pace_v > 0 else self._tau
        return max(step, self.cost.decode_step_s)

    # --- the prefix cache -------------------------------------------------------------
    def hit(self, tid: str) -> int:
        """Tokens of the trajectory's context cached here (0 if evicted or never seen), in whole
        prefix-cache blocks (`ClusterCost.prefix_block_tokens`)."""
        n = self._cache.get(tid, 0)
        if n:
            self._cache.move_to_end(tid)
        return n - n % self.cost.prefix_block_tokens

    def touch(self, tid: str, tokens: int) -> None:
        self._cache_total += tokens - self._cache.pop(tid, 0)
        self._cache[tid] = tokens
        cap = self.cost.kv_capacity_tokens
        if self._cache_total <= cap:
            return
        floor = 0.9 * cap  # evict a little extra so the next touches need not scan again
        victims = []
        for old, n in self._cache.items():
            if self._cache_total <= floor:
                break
            if old != tid and old not in self._seqs and old not in self._pf_tids:
                victims.append(old)
                self._cache_total -= n
        for old in victims:
            del self._cache[old]

    # --- the fluid ----------------------------------------------------------------------
    def _advance(self) -> None:
        now = self.loop.now
        dt = now - self._t
        if dt > 0:
            if self._seqs or self._prefill:
                self.busy_s += dt
                b = len(self._seqs)
                acc = self.steps["mixed" if b and self._prefill else "decode" if b else "prefill"]
                acc[0] += dt
                acc[1] += dt / self._tau * b if b else 0.0
                acc[2] += dt * self._pf_rate if self._prefill else 0.0
                acc[3] += dt * b
            if self._seqs:
                self._v += dt / self._tau
                keep = math.exp(-dt / STEP_MEMORY_S)
                self._pace_t = self._pace_t * keep + dt
                self._pace_v = self._pace_v * keep + dt / self._tau
            if self._prefill:
                done = dt * self._pf_rate
                self._prefill[0][1] -= done
                self._pf_left -= done
        self._t = now

    def _admit(self) -> None:
        cap = self.cost.kv_capacity_tokens
        while self._wait and (not self._seqs or self.context() + self._wait[0][1] <= cap):
            tid, ctx, n = self._wait.popleft()
            self._wait_ctx -= ctx
            self._n += 1
            heapq.heappush(self._heap, (self._v + n, self._n, tid))
            self._finish[tid] = self._v + n
            self._seqs[tid] = (self._v, ctx)
            self._s += ctx - self._v

    def _reschedule(self) -> None:
        c = self.cost
        b = len(self._seqs)
        ctx = self.context()
        k = prefix = 0.0
        if self._prefill:
            _, left, end = self._prefill[0]
            k = min(c.step_tokens, max(self._pf_left, 1.0))
            prefix = max(end - left, 0.0)
            tau = c.step_time(b, ctx, k, prefix)
            self._pf_rate = k / tau
            if b:
                self._tau = tau
        elif b:
            self._tau = c.step_time(b, ctx)
        if self._measure is not None and (b or k):
            self._measure(b, ctx, k, self._tau if b else k / self._pf_rate, prefix)
        self._version += 1
        nxt = []
        if b:
            nxt.append(min(self._heap[0][0] - self._v, REFRESH_STEPS) * self._tau)
        if self._prefill:  # the head's end, or one chunk on (its prefix has grown)
            nxt.append(min(self._prefill[0][1], max(k, c.prefill_chunk_tokens)) / self._pf_rate)
        if nxt:
            self.loop.at(self._t + max(min(nxt), 0.0), self._tick, self._version)

    def _tick(self, version: int) -> None:
        if version != self._version:
            return  # superseded by a later change
        self._advance()
        decoded, prefilled = [], []
        while self._heap and self._heap[0][0] <= self._v + _EPS:
            _, _, tid = heapq.heappop(self._heap)
            v0, ctx = self._seqs.pop(tid)
            del self._finish[tid]
            self._s -= ctx - v0
            self.touch(tid, ctx + round(self._v - v0))
            decoded.append(tid)
        while self._prefill and self._prefill[0][1] <= _EPS:
            tid, left, _ = self._prefill.popleft()
            self._pf_left -= left
            if self._pf_tids[tid] == 1:
                del self._pf_tids[tid]
            else:
                self._pf_tids[tid] -= 1
            prefilled.append(tid)
        self._admit()
        self._reschedule()
        for tid in decoded:
            self._decoded(self, tid)
        for tid in prefilled:
            self._prefilled(self, tid)
