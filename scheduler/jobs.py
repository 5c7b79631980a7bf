"""Trajectory and batch states, with the one table of legal transitions.

The transitions themselves run inside Redis (Lua in `scheduler.queue`) so that they are
atomic; this table is what those scripts implement and what `Queue.complete` checks before
sending a result. Batches: queued -> running -> completed | cancelled (in the same scripts).
"""

from __future__ import annotations

from wire import TrajectoryState as S

TRANSITIONS: dict[S, frozenset[S]] = {
    S.queued: frozenset({S.running, S.cancelled}),
    # running -> queued is a retry: a lost lease or an infrastructure failure within budget.
    S.running: frozenset({S.queued, S.completed, S.truncated, S.failed, S.cancelled}),
    S.completed: frozenset(),
    S.truncated: frozenset(),
    S.failed: frozenset(),
    S.cancelled: frozenset(),
}

class IllegalTransition(ValueError):
    pass


def check_transition(old: S, new: S) -> None:
    if new not in TRANSITIONS[old]:
        raise IllegalTransition(f"trajectory cannot go from {old.value} to {new.value}")
