"""Engine routing: which engine serves a trajectory's next turn.

`StickyLeastLoaded` keeps a trajectory on the engine that served its last turn (its prefix
is in that engine's KV cache) and sends a new trajectory to the engine with the fewest
in-flight tokens. `RoleAware` routes the prefill and the decode of a turn by engine role
(prefill/decode disaggregation). Policies are plain objects with `pick` and `forget`; loads
are passed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from scheduler.roles import Role


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


class RoleAware:
    """Route a turn by engine role: its prefill to a `prefill` (or `mixed`) engine, its decode
    to a `decode` engine, or kept where it was prefilled when that engine is `mixed` (no KV
    transfer). Each half is sticky per trajectory (prefix caches), least-loaded otherwise.

    Roles come from the allocator through `set_roles`; an engine missing from the roles
    (draining, dead, unknown) gets nothing new. With every engine `mixed` this routes exactly
    like `StickyLeastLoaded`. `pick`/`forget` make it a `RoutingPolicy` (pick = the prefill).
    A sticky hit reads only its own engine's entry in `loads`, so a lazy mapping stays cheap.

        router = RoleAware({"e0": Role.prefill, "e1": Role.decode})
        p = router.pick_prefill(tid, loads); d = router.pick_decode(tid, loads, p)
    """

    def __init__(self, roles: Mapping[str, Role] | None = None, max_tracked: int = 100_000,
                 rebalance: float = 2.0, slack_tokens: int = 65_536):
        self.roles: dict[str, Role] = dict(roles or {})
        self._max = max_tracked
        # Stickiness yields when the sticky engine holds more than `rebalance` times the least-loaded
        # one's tokens plus `slack_tokens`: after a role change, conversations stuck to a few engines
        # would otherwise keep the rest idle (the prefix is re-fetched or recomputed, once)
        self.rebalance, self.slack = rebalance, slack_tokens
        self._prefill: dict[str, str] = {}  # trajectory -> engine; bounded, oldest dropped first
        self._decode: dict[str, str] = {}

    def set_roles(self, roles: Mapping[str, Role]) -> None:
        self.roles = dict(roles)

    def pick(self, trajectory_id: str, loads: Mapping[str, int]) -> str:
        return self.pick_prefill(trajectory_id, loads)

    def pick_prefill(self, trajectory_id: str, loads: Mapping[str, int]) -> str:
        eid = self._prefill.get(trajectory_id)
        sticky = eid is not None and eid in loads and eid in self.roles and self.roles[eid].prefills
        if sticky and (not self.rebalance or loads[eid] <= self.slack):
            return eid
        able = [e for e in loads if e in self.roles and self.roles[e].prefills]
        if not able:
            raise NoEngine("no engine takes prefill")
        if sticky and loads[eid] <= self.rebalance * min(loads[e] for e in able) + self.slack:
            return eid
        return self._stick(self._prefill, trajectory_id, able, loads)

    def pick_decode(self, trajectory_id: str, loads: Mapping[str, int], prefilled_on: str) -> str:
        """Where the decode runs after a prefill on `prefilled_on`: there if it decodes (a mixed
        engine, or one that became a decode engine while the prefill was queued), else a decode
        engine."""
        if prefilled_on in self.roles and self.roles[prefilled_on].decodes:
            return prefilled_on
        eid = self._decode.get(trajectory_id)
        if eid is not None and eid in loads and self.roles.get(eid) is Role.decode:
            return eid
        able = [e for e in loads if self.roles.get(e) is Role.decode]
        if not able:
            able = [e for e in loads if e in self.roles and self.roles[e].decodes]
        if not able:
            raise NoEngine("no engine takes decode")
        return self._stick(self._decode, trajectory_id, able, loads)

    def _stick(self, sticky: dict[str, str], tid: str, able: list[str], loads: Mapping[str, int]) -> str:
        eid = min(able, key=lambda e: (loads[e], e))
        sticky.pop(tid, None)
        if len(sticky) >= self._max:
            sticky.pop(next(iter(sticky)))
        sticky[tid] = eid
        return eid

    def forget(self, trajectory_id: str) -> None:
        self._prefill.pop(trajectory_id, None)
        self._decode.pop(trajectory_id, None)
