"""Engine routing: which engine serves a trajectory's next turn. A plug point: a policy is
any `RoutingPolicy`, chosen by the setting `ROLLOUT_ROUTING` from `POLICIES`.

`StickyLeastLoaded` (`sticky`) keeps a trajectory on the engine that served its last turn
(its prefix is in that engine's KV cache) and sends a new trajectory to the engine with the
fewest in-flight tokens; it ignores roles. `RoleAware` (`role_aware`, the default) routes the
prefill and the decode of a turn by engine role (prefill/decode disaggregation). Loads and
roles are passed in on every call: the registry is their one source, a policy keeps only its
stickiness.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from scheduler.roles import Role

# the roles that take each half of a turn (`Role.prefills`, `Role.decodes`), as sets: the router
# tests every engine's role on most picks, and a property call apiece was ~7% of a 128-engine
# simulation's time
_PREFILLS = frozenset(r for r in Role if r.prefills)
_DECODES = frozenset(r for r in Role if r.decodes)


class RoutingPolicy(Protocol):
    def route(self, trajectory_id: str, loads: Mapping[str, int], roles: Mapping[str, Role]) -> tuple[str, str]:
        """(prefill engine, decode engine) for the trajectory's next turn: one engine twice
        unless roles split the turn. `loads`: in-flight tokens of the engines that may serve;
        `roles`: the role of each engine taking new work (a draining engine is absent).
        Raises `NoEngine` when none fits."""

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

    def route(self, trajectory_id: str, loads: Mapping[str, int], roles: Mapping[str, Role]) -> tuple[str, str]:
        eid = self.pick(trajectory_id, loads)
        return eid, eid

    def forget(self, trajectory_id: str) -> None:
        self._sticky.pop(trajectory_id, None)


class RoleAware:
    """Route a turn by engine role: its prefill to a `prefill` (or `mixed`) engine, its decode
    to a `decode` engine, or kept where it was prefilled when that engine is `mixed` (no KV
    transfer). Each half is sticky per trajectory (prefix caches), least-loaded otherwise.

    Roles come with every call (from the registry, through the fleet); an engine missing from
    them (draining, dead, unknown) gets nothing new. With every engine `mixed` this routes
    exactly like `StickyLeastLoaded` while no engine holds far more than the others (see
    `rebalance`). A sticky hit reads only its own engine's entry in `loads`, so a lazy mapping
    stays cheap.

        router = RoleAware()
        p, d = router.route(tid, loads, {"e0": Role.prefill, "e1": Role.decode})
    """

    def __init__(self, max_tracked: int = 100_000, rebalance: float = 2.0, slack_tokens: int = 65_536):
        self._max = max_tracked
        # Stickiness yields when the sticky engine holds more than `rebalance` times the least-loaded
        # one's tokens plus `slack_tokens`: after a role change, conversations stuck to a few engines
        # would otherwise keep the rest idle (the prefix is re-fetched or recomputed, once)
        self.rebalance, self.slack = rebalance, slack_tokens
        self._prefill: dict[str, str] = {}  # trajectory -> engine; bounded, oldest dropped first
        self._decode: dict[str, str] = {}

    def route(self, trajectory_id: str, loads: Mapping[str, int], roles: Mapping[str, Role]) -> tuple[str, str]:
        p = self.pick_prefill(trajectory_id, loads, roles)
        return p, self.pick_decode(trajectory_id, loads, p, roles)

    def pick_prefill(self, trajectory_id: str, loads: Mapping[str, int], roles: Mapping[str, Role]) -> str:
        eid = self._prefill.get(trajectory_id)
        sticky = eid is not None and eid in loads and eid in roles and roles[eid].prefills
        if sticky and (not self.rebalance or loads[eid] <= self.slack):
            return eid
        able = [e for e in loads if roles.get(e) in _PREFILLS]
        if not able:
            raise NoEngine("no engine takes prefill")
        if sticky and not self._far_busier(loads[eid], min(map(loads.__getitem__, able))):
            return eid
        return self._stick(self._prefill, trajectory_id, able, loads)

    def pick_decode(self, trajectory_id: str, loads: Mapping[str, int], prefilled_on: str,
                    roles: Mapping[str, Role]) -> str:
        """Where the decode runs after a prefill on `prefilled_on`: there if it decodes (a mixed
        engine, or one that became a decode engine while the prefill was queued) and is not
        crowded (`_crowded`), else a decode engine."""
        if prefilled_on in roles and roles[prefilled_on].decodes and not self._crowded(prefilled_on, loads, roles):
            return prefilled_on
        eid = self._decode.get(trajectory_id)
        sticky = eid is not None and eid in loads and roles.get(eid) is Role.decode
        if sticky and (not self.rebalance or loads[eid] <= self.slack):
            return eid
        able = [e for e in loads if roles.get(e) is Role.decode]
        if not able:
            able = [e for e in loads if roles.get(e) in _DECODES]
        if not able:
            raise NoEngine("no engine takes decode")
        # the rule that makes prefill stickiness yield: conversations that met a moment with one decode
        # engine (the rest draining toward prefill) would otherwise stay on it for their whole life
        if sticky and not self._far_busier(loads[eid], min(map(loads.__getitem__, able))):
            return eid
        return self._stick(self._decode, trajectory_id, able, loads)

    def _crowded(self, eid: str, loads: Mapping[str, int], roles: Mapping[str, Role]) -> bool:
        """A mixed engine holds far more than the least-loaded engine that decodes (the rule that makes
        prefill stickiness yield): a decode goes elsewhere, its KV with it. A prefill engine that became
        mixed with a burst of prompts queued would otherwise decode every one of them itself."""
        if not self.rebalance or eid not in loads or loads[eid] <= self.slack:
            return False
        others = [e for e in loads if e != eid and roles.get(e) in _DECODES]
        return bool(others) and self._far_busier(loads[eid], min(map(loads.__getitem__, others)))

    def _far_busier(self, load: int, least: int) -> bool:
        """More than `rebalance` times the least load of the others (`least`) plus `slack_tokens`."""
        return load > self.rebalance * least + self.slack

    def _stick(self, sticky: dict[str, str], tid: str, able: list[str], loads: Mapping[str, int]) -> str:
        eid = min(zip(map(loads.__getitem__, able), able))[1]  # the least-loaded; ties by id
        sticky.pop(tid, None)
        if len(sticky) >= self._max:
            sticky.pop(next(iter(sticky)))
        sticky[tid] = eid
        return eid

    def forget(self, trajectory_id: str) -> None:
        self._prefill.pop(trajectory_id, None)
        self._decode.pop(trajectory_id, None)


# The routing policies a deployment can choose (`ROLLOUT_ROUTING`). A new policy: a class with
# `route` and `forget` in its own module, and one line here.
POLICIES: dict[str, Callable[[], RoutingPolicy]] = {
    "role_aware": RoleAware,
    "sticky": StickyLeastLoaded,
}


def make_policy(name: str) -> RoutingPolicy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"no routing policy {name!r}; known: {', '.join(POLICIES)}") from None
