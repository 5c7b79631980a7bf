"""Per-trajectory lifecycle: where every live trajectory is, since when, at which turn, with
how many tokens. The forecaster reads it; observers learn from its transitions.

    queued ──on_prefill──▶ prefilling ──on_decode──▶ decoding ──on_tool──▶ tool ──on_prefill──▶ prefilling …
                                   └──────on_tool (no separate decode signal)──┘      any ──on_done──▶ done

`on_prefill` marks a turn's request reaching the engines (its prompt delta is the prefill
demand); from `tool` it opens the next turn. `on_tool` records the response length and the
start of the environment step (a tool call, or the final grading). Live callers without a
first-token signal may go `prefilling → tool` directly. Illegal transitions raise.

Every method takes `now` (seconds) so the simulator can drive it on its own clock; the live
worker passes nothing and gets `time.monotonic()`.

Non-goals: durability (Redis holds the truth; this is a rebuildable cache), forecasting.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from scheduler.jobs import IllegalTransition


class Phase(str, Enum):
    queued = "queued"
    prefilling = "prefilling"
    decoding = "decoding"
    tool = "tool"
    done = "done"


# The phases as plain names for the per-transition path (an enum member read off its class costs
# ~60 ns on Python 3.11)
_QUEUED, _PREFILLING, _DECODING, _TOOL, _DONE = Phase.queued, Phase.prefilling, Phase.decoding, Phase.tool, Phase.done
_ALL_LIVE = frozenset({Phase.queued, Phase.prefilling, Phase.decoding, Phase.tool})
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.queued: frozenset({Phase.prefilling, Phase.done}),
    Phase.prefilling: frozenset({Phase.decoding, Phase.tool, Phase.done}),
    Phase.decoding: frozenset({Phase.tool, Phase.done}),
    Phase.tool: frozenset({Phase.prefilling, Phase.done}),
    Phase.done: frozenset(),
}


@dataclass(slots=True)
class Track:
    """One live trajectory. `context_tokens` is everything the engine has seen or sampled."""

    id: str
    env: str
    phase: Phase
    since: float
    submitted_at: float
    turn: int = 0
    tool: str | None = None
    prompt_tokens: int = 0  # the opening prompt
    pending_prefill: int = 0  # this turn's prompt delta
    context_tokens: int = 0
    generated_tokens: int = 0
    last_response: int = 0
    turn_arrived_at: float = 0.0  # when this turn's prefill demand arrived


class Observer(Protocol):
    def observe(self, t: Track, old: Phase, now: float, old_since: float, tokens: int) -> None:
        """`t` just left `old` (entered at `old_since`) for `t.phase`, at `now`. `tokens` is the
        change's delta: the prompt delta (to prefilling) or the response length (to tool or done).
        Arguments, not an object: three or more a trajectory, at thousands of trajectories a second."""


class Lifecycle:
    """Tracks live trajectories. Bounded: at most `max_live` at once (submitting more raises)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, observers: Iterable[Observer] = (),
                 max_live: int = 1_000_000):
        self.clock = clock
        self.observers = list(observers)
        self.max_live = max_live
        self._live: dict[str, Track] = {}
        self.finished = 0

    def __len__(self) -> int:
        return len(self._live)

    def get(self, tid: str) -> Track | None:
        return self._live.get(tid)

    def live(self) -> Iterable[Track]:
        return self._live.values()

    def counts(self) -> dict[Phase, int]:
        out = {p: 0 for p in _ALL_LIVE}
        for t in self._live.values():
            out[t.phase] += 1
        return out

    # --- verbs ---------------------------------------------------------------------------
    def on_submit(self, tid: str, env: str, prompt_tokens: int, now: float | None = None) -> Track:
        now = self.clock() if now is None else now
        if tid in self._live:
            raise IllegalTransition(f"trajectory {tid} is already live")
        if len(self._live) >= self.max_live:
            raise OverflowError(f"lifecycle holds {self.max_live} live trajectories already")
        t = Track(tid, env, _QUEUED, now, now, prompt_tokens=prompt_tokens, pending_prefill=prompt_tokens,
                  turn_arrived_at=now)
        self._live[tid] = t
        return t

    def on_prefill(self, tid: str, tokens: int, now: float | None = None) -> None:
        """This turn's request (prompt delta of `tokens`) reaches the engines."""
        t, old, old_since, now = self._move(tid, _PREFILLING, now)
        if old is _TOOL:
            t.turn += 1
        t.pending_prefill = tokens
        t.context_tokens += tokens
        t.turn_arrived_at = now
        self._emit(t, old, now, old_since, tokens)

    def on_decode(self, tid: str, now: float | None = None) -> None:
        t, old, old_since, now = self._move(tid, _DECODING, now)
        t.pending_prefill = 0
        self._emit(t, old, now, old_since, 0)

    def on_tool(self, tid: str, response_tokens: int, now: float | None = None, tool: str | None = None) -> None:
        """The response is sampled (`response_tokens`); the environment step starts."""
        t, old, old_since, now = self._move(tid, _TOOL, now)
        self._respond(t, response_tokens)
        t.tool = tool
        self._emit(t, old, now, old_since, response_tokens)

    def on_done(self, tid: str, now: float | None = None, response_tokens: int = 0) -> None:
        """The trajectory ends (from decoding: its last response had `response_tokens`)."""
        t, old, old_since, now = self._move(tid, _DONE, now)
        if old is _DECODING or old is _PREFILLING:
            self._respond(t, response_tokens)
        del self._live[tid]
        self.finished += 1
        self._emit(t, old, now, old_since, response_tokens)

    # --- internals -----------------------------------------------------------------------
    def _move(self, tid: str, new: Phase, now: float | None) -> tuple[Track, Phase, float, float]:
        now = self.clock() if now is None else now
        t = self._live.get(tid)
        if t is None:
            raise IllegalTransition(f"trajectory {tid} is not live")
        if new not in TRANSITIONS[t.phase]:
            raise IllegalTransition(f"trajectory {tid} cannot go from {t.phase.value} to {new.value}")
        old, old_since = t.phase, t.since
        t.phase, t.since = new, now
        return t, old, old_since, now

    @staticmethod
    def _respond(t: Track, n: int) -> None:
        t.pending_prefill = 0
        t.last_response = n
        t.generated_tokens += n
        t.context_tokens += n

    def _emit(self, t: Track, old: Phase, now: float, old_since: float, tokens: int) -> None:
        for o in self.observers:
            o.observe(t, old, now, old_since, tokens)
