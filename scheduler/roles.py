"""Engine roles and the engine state machine: `starting → ready(role) → draining → ready(new role) | dead`.

A role says which half of a turn an engine serves: `prefill` (prompt tokens → KV, handed
over to a decode engine), `decode` (continues from transferred KV), or `mixed` (both,
colocated). The allocator decides roles; the router reads them. An engine only takes new
work while `ready`; `draining` means it finishes what it holds, then takes its next role.

On vLLM with every engine started `kv_both` (NixlConnector) a role is only a routing
decision, so a switch costs the drain, not a restart.

Non-goals: deciding roles (`scheduler.allocator`), picking an engine (`scheduler.router`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from scheduler.jobs import IllegalTransition


class Role(str, Enum):
    prefill = "prefill"
    decode = "decode"
    mixed = "mixed"

    @property
    def prefills(self) -> bool:
        return self is not Role.decode

    @property
    def decodes(self) -> bool:
        return self is not Role.prefill


class EngineState(str, Enum):
    starting = "starting"
    ready = "ready"
    draining = "draining"
    dead = "dead"


TRANSITIONS: dict[EngineState, frozenset[EngineState]] = {
    EngineState.starting: frozenset({EngineState.ready, EngineState.dead}),
    EngineState.ready: frozenset({EngineState.draining, EngineState.dead}),
    EngineState.draining: frozenset({EngineState.ready, EngineState.dead}),
    EngineState.dead: frozenset(),
}


@dataclass(slots=True)
class EngineRole:
    """One engine's state and role. `since` is when it entered the current state."""

    id: str
    state: EngineState = EngineState.starting
    role: Role | None = None
    next_role: Role | None = None  # set while draining
    since: float = 0.0
    switches: int = 0

    @property
    def accepts(self) -> bool:
        return self.state is EngineState.ready

    def _go(self, new: EngineState, now: float) -> None:
        if new not in TRANSITIONS[self.state]:
            raise IllegalTransition(f"engine {self.id} cannot go from {self.state.value} to {new.value}")
        self.state, self.since = new, now

    def ready(self, now: float, role: Role | None = None) -> None:
        """Start serving: from `starting` with `role`, or from `draining` with the planned next role."""
        if self.state is EngineState.draining:
            if role is not None and role is not self.next_role:
                raise IllegalTransition(f"engine {self.id} drained for {self.next_role}, not {role}")
            self._go(EngineState.ready, now)
            self.role, self.next_role, self.switches = self.next_role, None, self.switches + 1
            return
        if role is None:
            raise ValueError("a starting engine needs a role")
        self._go(EngineState.ready, now)
        self.role = role

    def drain(self, next_role: Role, now: float) -> None:
        if next_role is self.role:
            raise IllegalTransition(f"engine {self.id} already has role {next_role.value}")
        self._go(EngineState.draining, now)
        self.next_role = next_role

    def die(self, now: float) -> None:
        self._go(EngineState.dead, now)
        self.next_role = None
