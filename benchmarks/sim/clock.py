"""Simulated time: an event heap with its own clock.

`at(t, fn, arg)` schedules `fn(arg)` at time `t`; `run()` pops events in time order (ties in
insertion order, so runs are reproducible) until the heap is empty, `stop()` is called, or
`max_events` is spent (a runaway simulation raises instead of hanging).

Non-goals: real time, concurrency, cancellation (callers drop stale events themselves).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class EventLoop:
    def __init__(self, max_events: int = 50_000_000):
        self.now = 0.0
        self.events = 0
        self.max_events = max_events
        self._heap: list[tuple[float, int, Callable[[Any], None], Any]] = []
        self._seq = 0
        self._stopped = False

    def at(self, t: float, fn: Callable[[Any], None], arg: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (max(t, self.now), self._seq, fn, arg))

    def after(self, dt: float, fn: Callable[[Any], None], arg: Any = None) -> None:
        self.at(self.now + dt, fn, arg)

    def stop(self) -> None:
        self._stopped = True

    def run(self) -> float:
        heap = self._heap
        while heap and not self._stopped:
            t, _, fn, arg = heapq.heappop(heap)
            self.now = t
            self.events += 1
            if self.events > self.max_events:
                raise RuntimeError(f"simulation exceeded {self.max_events} events")
            fn(arg)
        return self.now
