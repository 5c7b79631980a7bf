"""Reward functions to re-score a recording with (`rollout replay FILE --score examples.rewards:NAME`).

A scorer takes a recorded `wire.Trajectory` (its task, its transcript in `messages`, its turns
with the exact sampled ids) and returns a float.
"""

from __future__ import annotations

from wire import Trajectory


def length_penalized(trajectory: Trajectory) -> float:
    """The recorded reward, less 0.001 per sampled token (a common brevity penalty)."""
    sampled = sum(len(t.output_ids) for t in trajectory.turns)
    return (trajectory.reward or 0.0) - 0.001 * sampled


def fewer_turns(trajectory: Trajectory) -> float:
    """Success counts only if reached within two turns."""
    return (trajectory.reward or 0.0) if len(trajectory.turns) <= 2 else 0.0
