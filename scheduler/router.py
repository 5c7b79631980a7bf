"""Engine routing: which engine serves a trajectory's next turn.

`StickyLeastLoaded` keeps a trajectory on the engine that served its last turn (its prefix
is in that engine's KV cache) and sends a new trajectory to the engine with the fewest
in-flight tokens. Policies are plain objects with `pick` and `forget`; loads are passed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class RoutingPolicy(Protocol):
    def pick(self, trajectory_id: str, loads: Mapping[str, int]) -> str: ...

    def forget(self, trajectory_id: str) -> None: ...


class NoEngine(Exception):
    """No engine is available to serve a request."""


class StickyLeastLoaded:
    def __init__(self, max_tracked: int = 100_000):
        self._sticky: dict[str, str] = {}
        self._max = max_tracked  # bounded: oldest stickiness is dropped first

    def pick(self, trajectory_id: str, loads: Mapping[str, int]) -> str:
        if not loads:
            raise NoEngine("no engine registered")
        eid = self._sticky.get(trajectory_id)
        if eid not in loads:
            eid = min(loads, key=lambda e: (loads[e], e))
            if len(self._sticky) >= self._max:
                self._sticky.pop(next(iter(self._sticky)))
            self._sticky[trajectory_id] = eid
        return eid

    def forget(self, trajectory_id: str) -> None:
        self._sticky.pop(trajectory_id, None)
