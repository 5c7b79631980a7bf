"""Engine role state machine: the legal path works, everything else raises."""

from __future__ import annotations

import pytest

from scheduler.jobs import IllegalTransition
from scheduler.roles import EngineRole, EngineState, Role


def test_start_drain_switch_die():
    e = EngineRole("e0")
    e.ready(0.0, Role.mixed)
    assert e.accepts and e.role is Role.mixed
    e.drain(Role.decode, 5.0)
    assert e.state is EngineState.draining and not e.accepts and e.since == 5.0
    e.ready(7.0)
    assert e.role is Role.decode and e.next_role is None and e.switches == 1 and e.since == 7.0
    e.die(9.0)
    assert e.state is EngineState.dead and not e.accepts


@pytest.mark.parametrize("bad", [
    lambda e: e.drain(Role.decode, 0.0),  # starting -> draining
    lambda e: (e.ready(0.0, Role.mixed), e.ready(1.0, Role.decode)),  # ready -> ready
    lambda e: (e.ready(0.0, Role.mixed), e.drain(Role.mixed, 1.0)),  # a switch to the same role
    lambda e: (e.die(0.0), e.ready(1.0, Role.mixed)),  # dead is final
    lambda e: (e.ready(0.0, Role.prefill), e.drain(Role.decode, 1.0), e.ready(2.0, Role.mixed)),  # wrong role
])
def test_illegal_transitions_raise(bad):
    with pytest.raises(IllegalTransition):
        bad(EngineRole("e0"))
