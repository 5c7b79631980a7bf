"""The forecaster on synthetic episodes whose statistics are known exactly."""

from __future__ import annotations

import heapq
import math
import random

import pytest

from scheduler.forecast import Demand, Forecaster, Latency, Prior
from scheduler.lifecycle import Lifecycle

END_P = 0.25  # an episode ends after each step with this probability
TOOL_MEAN = 2.0  # exponential tool latency, seconds
DECODE_TOK_S = 50.0


def response(turn: int, rng: random.Random) -> int:
    return int((100 + 50 * min(turn, 6)) * rng.uniform(0.8, 1.2))


def run(fc: Forecaster, n: int = 600, seed: int = 1, forecast_every: float = 1.0, horizon: float = 3.0):
    """A closed population: `n` episodes start over the first 20 s; forecasts every second."""
    rng = random.Random(seed)
    lc = Lifecycle(observers=[fc])
    heap, seq = [], 0

    def at(t, kind, tid):
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, seq, kind, tid))

    for i in range(n):
        at(rng.uniform(0, 20), "submit", f"t{i}")
    at(0.0, "forecast", "")
    while heap:
        now, _, kind, tid = heapq.heappop(heap)
        if kind == "forecast":
            if len(lc) or now < 20:
                fc.forecast(lc.live(), now, horizon)
                at(now + forecast_every, "forecast", "")
        elif kind == "submit":
            lc.on_submit(tid, "e", 200, now)
            lc.on_prefill(tid, 200, now)
            lc.on_decode(tid, now)
            at(now + response(0, rng) / DECODE_TOK_S, "decoded", tid)
        elif kind == "decoded":
            t = lc.get(tid)
            lc.on_tool(tid, response(t.turn, rng), now, tool="py")
            at(now + rng.expovariate(1 / TOOL_MEAN), "stepped", tid)
        elif kind == "stepped":
            t = lc.get(tid)
            if rng.random() < END_P:
                lc.on_done(tid, now)
                continue
            lc.on_prefill(tid, rng.randint(200, 400), now)
            lc.on_decode(tid, now)
            at(now + response(t.turn, rng) / DECODE_TOK_S, "decoded", tid)
    return now


def test_learns_the_statistics():
    fc = Forecaster()
    run(fc)
    for turn in range(5):
        want = 100 + 50 * turn
        assert abs(fc.response_tokens("e", turn) - want) < 0.06 * want, turn
    assert abs(fc.end_prob("e", 1) - END_P) < 0.05
    assert abs(fc.observation_tokens("e", "py") - 300) < 15
    assert abs(fc._tool("e", "py").latency.mean(0) - TOOL_MEAN) < 0.25
    assert abs(fc._speed.get(0) - DECODE_TOK_S) < 1.0


def test_forecast_error_is_small_once_learned_and_large_on_a_bad_prior():
    good = Forecaster()
    end = run(good)
    err = good.error(end, final=True)
    assert err.windows > 50
    assert err.prefill_wape < 0.25 and abs(err.prefill_bias) < 0.15, err
    assert err.decode_wape < 0.30 and abs(err.decode_bias) < 0.15, err
    # The same process forecast by a frozen forecaster holding a wrong prior: the error shows it.
    frozen = Forecaster(prior=Prior(response_tokens=2000, observation_tokens=40, tool_latency_s=60, end_prob=0.9),
                        learn=False)
    end = run(frozen)
    bad = frozen.error(end, final=True)
    assert bad.prefill_wape > 2 * err.prefill_wape


def test_conditional_return_probability():
    lat = Latency()
    for x in range(1, 11):  # latencies 1..10 s
        lat.add(float(x))
    assert lat.returns_within(0.0, 5.0, 1.0) == 0.5
    assert abs(lat.returns_within(5.0, 2.0, 1.0) - 2 / 5) < 1e-9  # of 6..10, 6 and 7 return by 7 s
    assert 0 < lat.returns_within(20.0, 5.0, 1.0) < 1  # past every sample: a memoryless tail
    for _ in range(600):  # bounded: old samples leave
        lat.add(100.0)
    assert len(lat.ordered) == lat.maxlen and lat.returns_within(0.0, 50.0, 1.0) == 0.0


def test_expected_episode_time_is_learned_per_env_from_submit_to_done():
    fc = Forecaster()
    lc = Lifecycle(observers=[fc])
    for i, (env, seconds) in enumerate([("short", 2.0), ("short", 4.0), ("long", 50.0)]):
        tid = f"t{i}"
        lc.on_submit(tid, env, 10, now=100.0)
        lc.on_prefill(tid, 10, now=100.0)
        lc.on_decode(tid, now=100.5)
        lc.on_tool(tid, 20, now=101.0, tool="x")
        lc.on_prefill(tid, 5, now=101.5)
        lc.on_decode(tid, now=101.5)
        lc.on_done(tid, now=100.0 + seconds, response_tokens=7)
    assert fc.expected_s() == {"short": 3.0, "long": 50.0}  # an env never finished is absent


def test_the_prefill_prefix_is_weighted_by_the_prefill_tokens():
    """A long conversation receiving a long observation outweighs a short one receiving its first
    prompt: what prefill attends to runs well above the mean live context."""
    lc = Lifecycle()
    lc.on_submit("long", "web", 20_000, 0.0)
    lc.on_prefill("long", 20_000, 0.0)
    lc.on_decode("long", 0.0)
    lc.on_tool("long", 500, 1.0, tool="browse")
    lc.on_prefill("long", 5_000, 2.0)  # after 20,500 tokens of conversation
    lc.on_submit("short", "math", 300, 2.0)
    lc.on_prefill("short", 300, 2.0)
    d = Forecaster().forecast(lc.live(), 2.0, 0.001)  # a horizon too short for arrivals: the backlog only
    assert d.prefill_arrivals == 0.0 and d.prefill_tokens == 5_300 and d.mean_context == 12_900
    # each token attends to the conversation before it and half of its own turn
    assert d.prefill_prefix == pytest.approx((5_000 * 23_000 + 300 * 150) / 5_300)
    back = Demand.from_report(d.report(), d.horizon_s)
    assert back.prefill_prefix == pytest.approx(d.prefill_prefix, rel=1e-3) and back.prefill_arrivals == 0.0


def test_decode_demand_counts_what_decodes_within_the_horizon():
    """A 4,000-token response decodes over 80 s at 50 tokens/s: a 10-s horizon sees 500 of it,
    decoding or waiting to prefill. Counted whole, long reasoning outputs outweighed the
    observations arriving in the same window, and a split with too few prefill engines looked
    best (the MoE's `shift`, 0.91-0.97x of the best split)."""
    fc = Forecaster(prior=Prior(response_tokens=4_000, decode_tok_s=50.0))
    lc = Lifecycle()
    for tid, decoding in (("a", True), ("b", False)):
        lc.on_submit(tid, "reason", 300, 0.0)
        lc.on_prefill(tid, 300, 0.0)
        if decoding:
            lc.on_decode(tid, 0.0)
    d = fc.forecast(lc.live(), 0.0, 10.0)
    assert d.decode_tokens == pytest.approx(2 * 500)
    short = Forecaster(prior=Prior(response_tokens=100, decode_tok_s=50.0)).forecast(lc.live(), 0.0, 10.0)
    assert short.decode_tokens == pytest.approx(2 * 100 + short.decode_arrivals, rel=0.05)  # short ones count whole


def test_the_contexts_of_episodes_ending_within_the_horizon_are_forecast():
    """An episode that ends after its step takes its conversation off the engines: its context is
    `ending_context` (what the allocator nets the arrivals' growth of contexts against)."""
    lc = Lifecycle()
    lc.on_submit("t", "e", 10_000, 0.0)
    lc.on_prefill("t", 10_000, 0.0)
    lc.on_decode("t", 0.0)
    lc.on_tool("t", 200, 1.0, tool="py")  # 10,200 tokens, in its environment step
    ends = Forecaster(prior=Prior(end_prob=1.0, tool_latency_s=2.0)).forecast(lc.live(), 1.0, 10.0)
    returns = 1.0 - math.exp(-10.0 / 2.0)  # the step returns within the horizon (exponential prior)
    assert ends.ending_context == pytest.approx(returns * 10_200) and ends.prefill_arrivals == 0.0
    goes_on = Forecaster(prior=Prior(end_prob=0.0, tool_latency_s=2.0)).forecast(lc.live(), 1.0, 10.0)
    assert goes_on.ending_context == 0.0 and goes_on.prefill_arrivals > 0
    back = Demand.from_report(ends.report(), ends.horizon_s)
    assert back.ending_context == pytest.approx(ends.ending_context, abs=1)


def test_the_recent_turns_are_measured_per_turn_over_a_sliding_window():
    """`Demand.turn_*` and `tool_s`: what the turns of the last two horizons brought, per turn (many
    short turns weigh as many, not as one trajectory), and zeros until enough are seen."""
    fc = Forecaster(horizon_s=5.0)  # a 10-s window
    lc = Lifecycle(observers=[fc])
    lc.on_submit("a", "web", 1_000, 0.0)
    lc.on_prefill("a", 1_000, 0.0)
    lc.on_decode("a", 0.0)
    t = 0.0
    for turn in range(1, 9):  # eight 2-s tool steps, each returning a 3,000-token observation
        lc.on_tool("a", 100, t + 1.0, tool="browse")
        t += 3.0
        lc.on_prefill("a", 3_000, t)
        lc.on_decode("a", t)
    cold = fc.forecast(lc.live(), t)
    assert cold.turn_response == 0.0  # 4 responses in the window: below `RecentTurns.MIN_TURNS`
    assert fc.recent.window_s == 10.0
    for _ in range(12):  # then a burst of short turns, within the window
        lc.on_tool("a", 300, t + 0.1, tool="browse")
        t += 0.2
        lc.on_prefill("a", 500, t)
        lc.on_decode("a", t)
    d = fc.forecast(lc.live(), t)
    # the window holds the last turns: 3 long (t ≥ t_end − 10) and 12 short, by prefill
    long_turns = sum(1 for k in range(1, 9) if 3.0 * k >= t - 10.0)
    n = long_turns + 12
    assert d.turn_prefill == pytest.approx((3_000 * long_turns + 500 * 12) / n)
    assert d.tool_s == pytest.approx((2.0 * long_turns + 0.1 * 12) / n)
    assert d.turn_response > 0 and d.turn_prefix > 0
    back = Demand.from_report(d.report(), d.horizon_s)
    for f in ("turn_prefill", "turn_prefix", "turn_response", "tool_s"):  # totals travel in whole tokens and ms
        assert getattr(back, f) == pytest.approx(getattr(d, f), abs=1.0)
