"""Short-horizon forecast of prefill and decode demand, learned from lifecycle transitions.

The forecaster is a lifecycle `Observer`: from every transition it learns, per environment,
the response length by turn, the chance an episode ends after a turn's step and an episode's
duration (`expected_s`, which the queue's longest-first ranking reads), and per
(environment, tool) the tool-latency distribution and the observation length. From the live
trajectories it then forecasts what the engines will be asked for in the next `horizon_s`:

- backlog (known): prompt deltas already waiting (queued / prefilling) and what of the
  responses being decoded or waiting decodes within the horizon (at the measured speed of one
  sequence: a 4,000-token reasoning output is not all this horizon's work);
- arrivals (forecast): each trajectory in a tool call returns within the horizon with
  probability P(L ≤ e+H | L > e) (empirical, e = time already spent in the tool), continues
  with probability 1 − P(end | turn), and then brings an observation to prefill and a
  response to decode (as much of it as decodes before the horizon ends); with probability
  P(end | turn) it ends, and its conversation leaves the engines (`ending_context`).

It records its own error: every forecast's arrivals are compared with what actually arrived
in that window (WAPE, Σ|forecast − actual| / Σ actual), for prefill tokens and for decode
tokens (the response tokens of turns that arrived in the window), and every response length
with its prediction. New submissions are not forecast (the trainer decides them); they count
as backlog once submitted.

Non-goals: choosing roles (`scheduler.allocator`), per-request length prediction from text.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from scheduler.lifecycle import Phase, Track

TURN_BUCKETS = 16  # turns past this share one bucket: late turns are few and alike
# The phases as plain names for the per-transition and per-track paths: on Python 3.11 reading an
# enum member off its class costs ~60 ns, a dozen of them a transition (three a trajectory at least)
_PREFILLING, _DECODING, _TOOL, _DONE = Phase.prefilling, Phase.decoding, Phase.tool, Phase.done


@dataclass(slots=True)
class Mean:
    """A running mean, capped in weight so it keeps following a drifting source."""

    n: float = 0.0
    value: float = 0.0
    cap: float = 500.0

    def add(self, x: float) -> None:
        n = self.n + 1.0
        if n > self.cap:  # (not min(): a builtin call costs more than the rest of this; several a turn)
            n = self.cap
        self.n = n
        self.value += (x - self.value) / n

    def get(self, prior: float) -> float:
        return self.value if self.n else prior


@dataclass(slots=True)
class Latency:
    """Recent tool latencies, kept sorted for conditional return probabilities."""

    maxlen: int = 512
    recent: deque = field(default_factory=deque)
    ordered: list = field(default_factory=list)
    total: float = 0.0

    def add(self, x: float) -> None:
        self.recent.append(x)
        self.total += x
        bisect.insort(self.ordered, x)
        if len(self.recent) > self.maxlen:
            old = self.recent.popleft()
            self.total -= old
            self.ordered.pop(bisect.bisect_left(self.ordered, old))

    def mean(self, prior: float) -> float:
        return self.total / len(self.recent) if self.recent else prior

    def returns_within(self, elapsed: float, horizon: float, prior_mean: float) -> float:
        """P(L ≤ elapsed + horizon | L > elapsed)."""
        xs = self.ordered
        if not xs:
            return 1.0 - math.exp(-horizon / prior_mean)
        above = len(xs) - bisect.bisect_right(xs, elapsed)
        if above == 0:  # longer than anything seen: assume a memoryless tail at the mean
            return 1.0 - math.exp(-horizon / max(self.total / len(xs), 1e-3))
        return (bisect.bisect_right(xs, elapsed + horizon) - (len(xs) - above)) / above


@dataclass(slots=True)
class ToolStats:
    latency: Latency = field(default_factory=Latency)
    observation: Mean = field(default_factory=Mean)


@dataclass(slots=True)
class EnvStats:
    response: list = field(default_factory=lambda: [Mean() for _ in range(TURN_BUCKETS)])
    ended: list = field(default_factory=lambda: [0.0] * TURN_BUCKETS)
    stepped: list = field(default_factory=lambda: [0.0] * TURN_BUCKETS)
    tools: dict = field(default_factory=dict)  # tool name -> ToolStats
    period: Mean = field(default_factory=Mean)  # turn arrival to next turn arrival, seconds
    duration: Mean = field(default_factory=Mean)  # a whole episode's active seconds, submit to done


@dataclass(slots=True)
class Prior:
    """What to assume before anything is learned. Deliberately vague."""

    response_tokens: float = 512.0
    observation_tokens: float = 512.0
    tool_latency_s: float = 2.0
    end_prob: float = 0.3
    decode_tok_s: float = 50.0  # one sequence's decode speed


@dataclass(slots=True)
class Demand:
    """Work the engines will be asked for within `horizon_s` (tokens), and its shape."""

    horizon_s: float
    prefill_tokens: float  # backlog + arrivals
    decode_tokens: float  # backlog + arrivals, as much of each response as decodes within the horizon
    decode_seqs: float  # expected sequences wanting decode at once
    mean_context: float  # tokens per live sequence
    prefill_arrivals: float = 0.0  # the forecast part, scored later
    decode_arrivals: float = 0.0  # the arriving turns' whole responses (scored against what they decode)
    turns: float = 0.0  # turns expected to reach the engines (waiting + arriving)
    live: int = 0
    mean_response: float = 0.0  # tokens per response (a prefill engine never saw the last one)
    observed: int = 0  # responses the forecaster has learned from so far (few: the forecast is mostly prior)
    # the context a prefill token attends to, mean weighted by prefill tokens: a turn's prefill
    # comes after its conversation, and the turns that prefill most (long observations) tend to
    # be the long conversations, so this runs well above `mean_context` (0: unknown, use that)
    prefill_prefix: float = 0.0
    # the conversation tokens of the episodes forecast to end within the horizon: their contexts
    # leave the engines, so the live contexts grow by the arrivals net of these (in an async steady
    # state, where ending episodes are replaced by new short ones, they hardly grow at all)
    ending_context: float = 0.0
    # the turns of the last `recent_s`, measured (0: too few seen): mean prefill tokens, the
    # context they attend to (weighted by tokens), response tokens, and the environment step after
    # a response (seconds; a last turn has none). Means over turns, not trajectories: `live`
    # trajectories cycling through prefill, decode and their tool make X turns a second with
    # live = X · (mean cycle per turn), so how fast a layout serves a turn sets the turn rate.
    # Measured, not forecast: the forecast sees only live trajectories, and in an async run the
    # ones that start within the horizon (all of a one-turn env's turns) are not live yet
    turn_prefill: float = 0.0
    turn_prefix: float = 0.0
    turn_response: float = 0.0
    tool_s: float = 0.0

    def report(self) -> dict[str, int]:
        """This worker's share, as the additive fields of a registry report (`forecast:*`): means
        travel as totals (mean × live), so the sum of every worker's report is the cluster's."""
        return {"forecast:prefill_tokens": round(self.prefill_tokens), "forecast:decode_tokens":
                round(self.decode_tokens), "forecast:decode_seqs": round(self.decode_seqs),
                "forecast:context_tokens": round(self.mean_context * self.live), "forecast:turns": round(self.turns),
                "forecast:live": self.live, "forecast:response_tokens": round(self.mean_response * self.live),
                # without it a live allocator read 0 responses learned and `min_observed` held every move
                "forecast:observed": self.observed,
                "forecast:prefix_tokens": round(self.prefill_prefix * self.prefill_tokens),
                # what is forecast to arrive, apart from the backlog waiting now (a burst: see the allocator)
                "forecast:prefill_arrivals": round(self.prefill_arrivals),
                "forecast:ending_tokens": round(self.ending_context),
                # per-turn means travel weighted by live like the rest (the sum is a live-weighted mean)
                "forecast:turn_prefill_tokens": round(self.turn_prefill * self.live),
                "forecast:turn_prefix_tokens": round(self.turn_prefix * self.live),
                "forecast:turn_response_tokens": round(self.turn_response * self.live),
                "forecast:tool_ms": round(self.tool_s * self.live * 1000)}

    @classmethod
    def from_report(cls, report: dict[str, int], horizon_s: float) -> Demand:
        """The cluster's demand from summed reports (other keys ignored); means weighted by live count."""
        f = {k: float(report.get(f"forecast:{k}", 0)) for k in _REPORTED}
        live = max(f["live"], 1.0)
        return cls(horizon_s=horizon_s, prefill_tokens=f["prefill_tokens"], decode_tokens=f["decode_tokens"],
                   decode_seqs=f["decode_seqs"], mean_context=f["context_tokens"] / live, turns=f["turns"],
                   live=int(f["live"]), mean_response=f["response_tokens"] / live, observed=int(f["observed"]),
                   prefill_prefix=f["prefix_tokens"] / f["prefill_tokens"] if f["prefill_tokens"] else 0.0,
                   prefill_arrivals=f["prefill_arrivals"], ending_context=f["ending_tokens"],
                   turn_prefill=f["turn_prefill_tokens"] / live, turn_prefix=f["turn_prefix_tokens"] / live,
                   turn_response=f["turn_response_tokens"] / live, tool_s=f["tool_ms"] / live / 1000)


_REPORTED = ("prefill_tokens", "decode_tokens", "decode_seqs", "context_tokens", "turns", "live", "response_tokens",
             "observed", "prefix_tokens", "prefill_arrivals", "ending_tokens", "turn_prefill_tokens",
             "turn_prefix_tokens", "turn_response_tokens", "tool_ms")


@dataclass(slots=True)
class ForecastError:
    prefill_wape: float  # Σ|forecast − actual| / Σ actual over resolved windows
    decode_wape: float
    prefill_bias: float  # Σ(forecast − actual) / Σ actual: > 0 over-forecasts
    decode_bias: float
    windows: int
    response_mape: float  # per-response |predicted − actual| / actual, token-weighted
    responses: int


class RecentTurns:
    """The turns of the last `window_s` seconds, as measured: sums over a sliding window, kept in
    `BUCKETS` time buckets (the window's edge is a bucket wide): a fixed few, where a record per
    turn held a worker's 160k at 4,000 turns a second (two a turn, for 20 s). A turn adds to its
    bucket only; the window's sums are taken when read (`fields`, every few seconds)."""

    MIN_TURNS = 8  # fewer and the means are noise: report 0 (unknown)
    BUCKETS = 64

    def __init__(self, window_s: float):
        self.window_s = window_s
        self._width = window_s / self.BUCKETS
        # [bucket index, prefill count, Σ tokens, Σ tokens x context attended, response count,
        #  Σ tokens, tool count, Σ seconds]
        self._buckets: deque[list] = deque()

    def clear(self) -> None:
        self._buckets.clear()

    def _bucket(self, now: float) -> list:
        i = now // self._width
        buckets = self._buckets
        if buckets and i <= buckets[-1][0]:  # (a clock that steps back adds to the last bucket)
            return buckets[-1]
        b = [i, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        buckets.append(b)
        self._expire(now)
        return b

    def _expire(self, now: float) -> None:
        """Drop the buckets that end before the window starts."""
        first = (now - self.window_s) // self._width  # the bucket the window starts in
        buckets = self._buckets
        while buckets and buckets[0][0] < first:
            buckets.popleft()

    def prefill(self, now: float, tokens: float, attends: float) -> None:
        """A turn's prefill of `tokens`, attending on average to `attends` tokens of context."""
        b = self._bucket(now)
        b[1] += 1
        b[2] += tokens
        b[3] += tokens * attends

    def response(self, now: float, tokens: float) -> None:
        b = self._bucket(now)
        b[4] += 1
        b[5] += tokens

    def tool(self, now: float, seconds: float) -> None:
        b = self._bucket(now)
        b[6] += 1
        b[7] += seconds

    def fields(self, now: float) -> dict[str, float]:
        """`Demand`'s per-turn fields: prefill tokens, the context they attend to, response tokens
        and tool seconds per turn (a turn begins with its prefill); zeros while too few are seen."""
        self._expire(now)
        n_p = s_p = s_a = n_r = s_r = s_t = 0.0
        for b in self._buckets:
            n_p += b[1]
            s_p += b[2]
            s_a += b[3]
            n_r += b[4]
            s_r += b[5]
            s_t += b[7]
        if n_p < self.MIN_TURNS or n_r < self.MIN_TURNS:
            return dict.fromkeys(("turn_prefill", "turn_prefix", "turn_response", "tool_s"), 0.0)
        return {"turn_prefill": s_p / n_p, "turn_prefix": s_a / s_p if s_p > 0 else 0.0,
                "turn_response": s_r / n_r, "tool_s": s_t / n_p}


class Forecaster:
    """`observe` lifecycle changes; `forecast(live, now)`; `error(now)`.

        fc = Forecaster(horizon_s=10)
        lifecycle = Lifecycle(observers=[fc])
        demand = fc.forecast(lifecycle.live(), now)
    """

    def __init__(self, horizon_s: float = 10.0, prior: Prior | None = None, max_records: int = 200_000,
                 decode_lag_s: float = 120.0, learn: bool = True, recent_s: float | None = None):
        self.horizon_s = horizon_s
        self.recent = RecentTurns(2.0 * horizon_s if recent_s is None else recent_s)
        self.learn = learn  # False: keep the statistics fixed (still scores itself)
        self.prior = prior or Prior()
        self.decode_lag_s = decode_lag_s  # a window's decode tokens are known once its turns finish
        self._envs: dict[str, EnvStats] = {}
        self._speed = Mean()
        self._forecasts: deque = deque(maxlen=max_records)  # (t, horizon, prefill, decode)
        self._prefill_actual: deque = deque(maxlen=max_records)  # (arrival t, tokens)
        self._decode_actual: deque = deque(maxlen=max_records)  # (arrival t, response tokens)
        self._open_turn: dict[str, float] = {}  # tid -> arrival time of its tool-return turn
        self._arrived: dict[str, float] = {}  # tid -> arrival time of its current turn
        self._resp_abs = self._resp_total = 0.0
        self._resp_n = 0
        self._learned = 0  # responses learned from (kept across `restart_clock`)

    def restart_clock(self) -> None:
        """Keep what was learned, forget the trajectories and the scoring: for a new run whose
        clock starts again (the simulator's next rollout phase; a live worker never needs it)."""
        for d in (self._forecasts, self._prefill_actual, self._decode_actual, self._open_turn, self._arrived):
            d.clear()
        self.recent.clear()
        self._resp_abs = self._resp_total = 0.0
        self._resp_n = 0

    # --- learning ----------------------------------------------------------------------
    def _env(self, env: str) -> EnvStats:
        s = self._envs.get(env)
        if s is None:
            s = self._envs[env] = EnvStats()
        return s

    def _tool(self, env: str, tool: str | None) -> ToolStats:
        tools = self._env(env).tools
        key = tool or ""
        ts = tools.get(key)
        if ts is None:
            ts = tools[key] = ToolStats()
        return ts

    def observe(self, t: Track, old: Phase, now: float, old_since: float, tokens: int) -> None:
        new = t.phase
        s = self._envs.get(t.env) or self._env(t.env)
        learn = self.learn
        if new is _PREFILLING:
            if old is _TOOL:
                if learn:
                    s.stepped[min(t.turn - 1, TURN_BUCKETS - 1)] += 1
                    ts = self._tool(t.env, t.tool)
                    ts.latency.add(now - old_since)
                    ts.observation.add(tokens)
                    last = self._arrived.get(t.id)
                    if last is not None:
                        s.period.add(now - last)
                self._prefill_actual.append((now, tokens))
                self._open_turn[t.id] = now
            self._arrived[t.id] = now
            self.recent.prefill(now, tokens, t.context_tokens - tokens / 2)
            if old is _TOOL:
                self.recent.tool(now, now - old_since)
        elif new is _TOOL or (new is _DONE and (old is _DECODING or old is _PREFILLING)):
            self._learn_response(t, s, old, now, old_since, tokens)
        if new is _DONE:
            if learn and (old is _TOOL or old is _DECODING):
                b = min(t.turn, TURN_BUCKETS - 1)
                s.stepped[b] += 1
                s.ended[b] += 1
            if learn:
                s.duration.add(now - t.submitted_at)
            self._open_turn.pop(t.id, None)
            self._arrived.pop(t.id, None)

    def _learn_response(self, t: Track, s: EnvStats, old: Phase, now: float, old_since: float, tokens: int) -> None:
        self.recent.response(now, tokens)
        m = s.response[min(t.turn, TURN_BUCKETS - 1)]
        predicted = m.get(self.prior.response_tokens)
        self._resp_abs += abs(predicted - tokens)
        self._resp_total += tokens
        self._resp_n += 1
        if self.learn:
            m.add(tokens)
            self._learned += 1
            if old is _DECODING and now > old_since:
                self._speed.add(tokens / (now - old_since))
        arrived = self._open_turn.pop(t.id, None)
        if arrived is not None:
            self._decode_actual.append((arrived, tokens))

    # --- the statistics, as the forecast uses them ---------------------------------------
    def response_tokens(self, env: str, turn: int) -> float:
        return self._env(env).response[min(turn, TURN_BUCKETS - 1)].get(self.prior.response_tokens)

    def end_prob(self, env: str, turn: int) -> float:
        s = self._env(env)
        b = min(turn, TURN_BUCKETS - 1)
        # One pseudo-observation of the prior keeps an unseen turn from reading as certain.
        return (s.ended[b] + self.prior.end_prob) / (s.stepped[b] + 1.0)

    def period(self, env: str) -> float:
        """Seconds from one turn's arrival to the next one's, in this environment."""
        prior = self.prior.tool_latency_s + self.prior.response_tokens / self.prior.decode_tok_s
        return max(self._env(env).period.get(prior), 1e-3)

    def expected_s(self) -> dict[str, float]:
        """Mean active seconds of one episode, per environment seen to finish one: what the
        queue ranks batches by when it runs the longest-expected first."""
        return {env: s.duration.value for env, s in self._envs.items() if s.duration.n}

    def observation_tokens(self, env: str, tool: str | None) -> float:
        return self._tool(env, tool).observation.get(self.prior.observation_tokens)

    # --- forecasting -------------------------------------------------------------------
    def forecast(self, live: Iterable[Track], now: float, horizon_s: float | None = None) -> Demand:
        h = self.horizon_s if horizon_s is None else horizon_s
        speed = self._speed.get(self.prior.decode_tok_s)
        p_back = d_back = p_arr = d_arr = d_in = seqs = ctx = turns = resp = attend = ending = 0.0
        within = h * speed  # what one sequence decodes in the horizon
        n = 0
        for t in live:
            n += 1
            ctx += t.context_tokens
            ts = self._tool(t.env, t.tool)
            if t.phase is _TOOL:
                elapsed = now - t.since
                p = ts.latency.returns_within(elapsed, h, self.prior.tool_latency_s)
                first = max(ts.latency.mean(self.prior.tool_latency_s) - elapsed, 0.0)
                seqs += p
            else:
                m = self.response_tokens(t.env, t.turn)
                left = m if t.phase is not _DECODING else max(m - (now - t.since) * speed, 0.25 * m)
                if t.phase is _DECODING:
                    d_back += min(left, within)
                else:
                    p_back += t.pending_prefill
                    attend += t.pending_prefill * (t.context_tokens - t.pending_prefill / 2)
                    d_back += min(m, within)
                    turns += 1
                seqs += 1
                busy = left / speed  # until the response is out and the step starts
                if busy >= h:
                    continue
                p = ts.latency.returns_within(0.0, h - busy, self.prior.tool_latency_s)
                first = busy + ts.latency.mean(self.prior.tool_latency_s)
            # The next turns that arrive within the horizon, each weighted by the chance the
            # episode is still going; later turns one learned turn period apart.
            turn, at, period = t.turn, first, self.period(t.env)
            starts = min(first, h / 2)  # when it starts decoding: given that it comes, about midway
            weight = p * (1.0 - self.end_prob(t.env, turn))
            # the conversation the next observation follows: what it holds, and the response still to come
            before = t.context_tokens + (0.0 if t.phase is _TOOL else left)
            ending += p * self.end_prob(t.env, t.turn) * before  # it ends after this step
            while weight > 0.01:
                turn += 1
                turns += weight
                obs = ts.observation.get(self.prior.observation_tokens)
                p_arr += weight * obs
                attend += weight * obs * (before + obs / 2)
                r = self.response_tokens(t.env, turn)
                d_arr += weight * r
                d_in += weight * min(r, max(h - starts, 0.0) * speed)  # what it decodes in the horizon
                before += obs + r
                at += period
                starts += period
                if at >= h:
                    break
                ending += weight * self.end_prob(t.env, turn) * before
                weight *= 1.0 - self.end_prob(t.env, turn)
            resp += t.last_response
        p_all = p_back + p_arr
        d = Demand(h, p_all, d_back + d_in, seqs, ctx / n if n else 0.0, p_arr, d_arr, turns, n,
                   resp / n if n else 0.0, self._learned, attend / p_all if p_all else 0.0, ending,
                   **self.recent.fields(now))
        self._forecasts.append((now, h, p_arr, d_arr))
        return d

    # --- scoring -----------------------------------------------------------------------
    def error(self, now: float, final: bool = False) -> ForecastError:
        """Score every forecast whose window has closed (`final`: all of them)."""
        p_times, p_cum = _cumulative(self._prefill_actual)
        d_times, d_cum = _cumulative(sorted(self._decode_actual))
        pe = pa = pb = de = da = db = 0.0
        windows = 0
        for t, h, fp, fd in self._forecasts:
            if not final and t + h > now:
                continue
            ap = _window(p_times, p_cum, t, t + h)
            pe, pa, pb = pe + abs(fp - ap), pa + ap, pb + fp - ap
            windows += 1
            if final or t + h + self.decode_lag_s <= now:
                ad = _window(d_times, d_cum, t, t + h)
                de, da, db = de + abs(fd - ad), da + ad, db + fd - ad
        nan = float("nan")
        return ForecastError(pe / pa if pa else nan, de / da if da else nan, pb / pa if pa else nan,
                             db / da if da else nan, windows,
                             self._resp_abs / self._resp_total if self._resp_total else nan, self._resp_n)


def _cumulative(pairs: Iterable[tuple[float, float]]) -> tuple[list[float], list[float]]:
    times, cum, total = [], [0.0], 0.0
    for t, x in pairs:
        times.append(t)
        total += x
        cum.append(total)
    return times, cum


def _window(times: list[float], cum: list[float], lo: float, hi: float) -> float:
    """Sum of values with lo < time ≤ hi (a forecast made at `lo` cannot see arrivals at `lo`)."""
    return cum[bisect.bisect_right(times, hi)] - cum[bisect.bisect_right(times, lo)]
