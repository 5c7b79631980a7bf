"""Lifecycle tracking: phases, turns, token counts, time in state, observers."""

from __future__ import annotations

import pytest

from scheduler.jobs import IllegalTransition
from scheduler.lifecycle import Lifecycle, Phase


class Recorder:
    def __init__(self):
        self.changes = []

    def observe(self, t, old, now, old_since, tokens):
        self.changes.append((old, t.phase, now - old_since, tokens, t.turn))


def test_a_two_turn_episode():
    rec = Recorder()
    lc = Lifecycle(clock=lambda: 0.0, observers=[rec])
    lc.on_submit("t", "coding", 100, now=0.0)
    assert lc.get("t").phase is Phase.queued and lc.counts()[Phase.queued] == 1
    lc.on_prefill("t", 100, now=1.0)
    lc.on_decode("t", now=1.5)
    lc.on_tool("t", 40, now=3.5, tool="python")
    t = lc.get("t")
    assert (t.phase, t.turn, t.context_tokens, t.generated_tokens, t.tool) == (Phase.tool, 0, 140, 40, "python")
    lc.on_prefill("t", 25, now=5.0)  # observation back: turn 1
    assert lc.get("t").turn == 1 and lc.get("t").context_tokens == 165 and lc.get("t").since == 5.0
    lc.on_decode("t", now=5.1)
    lc.on_done("t", now=6.1, response_tokens=10)
    assert lc.get("t") is None and len(lc) == 0 and lc.finished == 1
    # time in the state being left, and the tokens of each change
    assert rec.changes[2] == (Phase.decoding, Phase.tool, 2.0, 40, 0)
    assert rec.changes[3] == (Phase.tool, Phase.prefilling, 1.5, 25, 1)
    assert rec.changes[-1][:2] == (Phase.decoding, Phase.done)


def test_illegal_transitions_raise():
    lc = Lifecycle()
    lc.on_submit("t", "math", 10)
    with pytest.raises(IllegalTransition):
        lc.on_decode("t")  # queued -> decoding skips the prefill
    with pytest.raises(IllegalTransition):
        lc.on_submit("t", "math", 10)  # already live
    with pytest.raises(IllegalTransition):
        lc.on_tool("nope", 3)
    lc.on_done("t")
    with pytest.raises(IllegalTransition):
        lc.on_prefill("t", 1)  # done is final


def test_bounded():
    lc = Lifecycle(max_live=2)
    lc.on_submit("a", "m", 1)
    lc.on_submit("b", "m", 1)
    with pytest.raises(OverflowError):
        lc.on_submit("c", "m", 1)
