"""Allocator decisions on hand-built scenarios: what it picks, when it moves, and that it
does not flap."""

from __future__ import annotations

import dataclasses
import random

import pytest

from scheduler.allocator import Allocator, AllocatorConfig, Capacity, Layout
from scheduler.forecast import Demand
from scheduler.roles import EngineState, Role

IDS = [f"e{i}" for i in range(8)]


def additive() -> Capacity:
    """A DP-attention group as the simulator measures it (8 ranks of 2,048 chunk tokens): the first
    chunk on one rank stalls every rank's step ~23 ms, the rest of the budget costs little."""
    return Capacity(step=[0.0057, 1.8e-6, 2.8e-9, 1.0e-5, 1.8e-4, 8.2e-7], chunk_tokens=16_384, rank_tokens=2048,
                    kv_tokens=9e6)


# a steady stream of prefill: it arrives within the horizon (a backlog waiting now is a burst)
PREFILL_HEAVY = Demand(15, 8e5, 6e5, 1000, 3000, prefill_arrivals=8e5, turns=1400, live=1000, mean_response=300)
DECODE_ONLY = Demand(horizon_s=15, prefill_tokens=0, decode_tokens=64_000, decode_seqs=64, mean_context=1000)


def test_plan_decode_only_keeps_everything_mixed():
    a = Allocator(IDS, additive())
    lay, _ = a.plan(DECODE_ONLY)
    assert lay == Layout(0, 0, 8)


def test_plan_prefill_heavy_disaggregates_when_interference_is_high():
    a = Allocator(IDS, additive())
    lay, est = a.plan(PREFILL_HEAVY)
    assert lay.prefill >= 1
    assert est < 0.9 * a.estimate(Layout(0, 0, 8), PREFILL_HEAVY)


def test_plan_prefill_heavy_stays_mixed_when_prefill_overlaps_decode():
    cap = Capacity(prefill_tok_s=20_000, step=[0.010, 1e-4, 4e-8, 0.0])  # colocated prefill costs decode nothing
    lay, _ = Allocator(IDS, cap).plan(PREFILL_HEAVY)
    assert lay == Layout(0, 0, 8)


def test_split_pays_for_recompute_when_contexts_do_not_fit():
    cap = Capacity(prefill_tok_s=20_000, kv_tokens=400_000)
    a = Allocator(IDS, cap)
    fits = Demand(15, 2e5, 64_000, 64, 1000, turns=200, live=200, mean_response=300)
    spills = Demand(15, 2e5, 64_000, 64, 50_000, turns=200, live=200, mean_response=300)
    assert a.prefill_tokens(fits, 8, split=False) == 2e5  # everything cached on 8 engines
    assert a.prefill_tokens(fits, 2, split=True) == 2e5 + 200 * 300  # the last responses
    assert a.prefill_tokens(spills, 2, split=True) > a.prefill_tokens(spills, 8, split=False) > 2e5
    pushed = Allocator(IDS, cap, AllocatorConfig(response_kv_pushed=True))
    assert pushed.prefill_tokens(fits, 2, split=True) == 2e5  # the response's KV came back: no recompute


def test_where_kv_moves_between_engines_every_engine_caches_for_the_prefill_ones():
    """1 prefill + 3 decode engines, live contexts 1.5x one engine's KV: without KV transfer the
    prefill engine recomputes what it evicted; with it, it reads the conversation back from the
    engine that decoded it, so the split is priced with no recompute (4 engines' KV hold it all)."""
    cap = additive()
    big = Demand(15, 2e5, 64_000, 64, 1.5 * cap.kv_tokens / 200, prefill_arrivals=2e5, turns=200, live=200,
                 mean_response=300)
    split = Layout(1, 3, 0)
    alone = Allocator(IDS[:4], cap)
    moved = Allocator(IDS[:4], cap, AllocatorConfig(response_kv_pushed=True))
    assert alone.prefill_tokens(big, 1, split=True) > 2 * big.prefill_tokens  # full contexts recomputed
    assert moved.estimate(split, big) < 0.6 * alone.estimate(split, big)
    assert moved.prefill_tokens(big, 4, split=True) == big.prefill_tokens  # what the estimate charges it


def dense() -> Capacity:
    """One 8B GPU as measured: a chunk costs its tokens, a mixed step saves one weight read."""
    return Capacity(step=[0.0048, 2.0e-5, 2.9e-8, 2.4e-5, -0.002, 0.0], kv_tokens=8.5e5)


# a steady stream of prefill: it arrives within the horizon (a backlog waiting now is a burst)
PREFILL_HEAVY = Demand(15, 8e5, 6e5, 1000, 3000, prefill_arrivals=8e5, turns=1400, live=1000, mean_response=300)


def test_plan_splits_a_dp_attention_group_and_keeps_a_dense_gpu_mixed():
    for cap, want_split in ((additive(), True), (dense(), False)):
        a = Allocator([f"e{i}" for i in range(4)], cap, AllocatorConfig(response_kv_pushed=True))
        lay, est = a.plan(PREFILL_HEAVY)
        colocated = a.estimate(Layout(0, 0, 4), PREFILL_HEAVY)
        if want_split:
            assert lay.prefill >= 1 and lay.mixed == 0 and est < 0.8 * colocated
        else:
            assert lay == Layout(0, 0, 4)


def test_plan_searches_whole_layouts():
    a = Allocator(IDS, additive())
    lays = a.candidates(8)
    assert Layout(2, 3, 3) in lays and Layout(0, 8, 0) in lays and len(lays) == 45  # every (p, d, m)
    big = a.candidates(128)
    assert len(big) < 200 and Layout(0, 0, 128) in big and Layout(16, 112, 0) in big  # a grid on big clusters


def test_allocate_moves_when_gain_beats_cost_and_drains_first():
    a = Allocator(IDS, additive(), AllocatorConfig(dwell_s=30, max_moves=0.25, confirm=1))
    moves = a.allocate(PREFILL_HEAVY, {e: 0.0 for e in IDS}, now=60.0)
    assert 1 <= len(moves) <= 2  # at most a quarter of the cluster per decision, prefill first
    assert moves[0].new is Role.prefill
    for m in moves:
        assert a.engines[m.engine].state is EngineState.draining and m.engine not in a.roles()
    assert a.layout().prefill == sum(m.new is Role.prefill for m in moves)
    assert a.allocate(PREFILL_HEAVY, {}, now=61.0) == []  # nothing new moves while one drains
    for m in moves:
        assert a.drained(m.engine, 62.0) is m.new
    assert sum(r is Role.prefill for r in a.roles().values()) == sum(m.new is Role.prefill for m in moves)


def test_may_move_more_than_a_quarter_at_once_when_the_forecast_says_so():
    a = Allocator(IDS, additive(), AllocatorConfig(confirm=1, response_kv_pushed=True))
    moves = a.allocate(PREFILL_HEAVY, {}, now=60.0)
    assert len(moves) > len(IDS) // 4


def test_a_target_must_win_twice_in_a_row():
    a = Allocator(IDS, additive(), AllocatorConfig(confirm=2))
    busy = {e: 5.0 for e in IDS}  # every engine holds 5 s of work: a move is dear
    assert a.allocate(PREFILL_HEAVY, busy, now=60.0) == []
    assert a.allocate(DECODE_ONLY, busy, now=65.0) == []  # the burst is over: nothing confirmed
    assert a.allocate(PREFILL_HEAVY, busy, now=70.0) == []
    assert a.allocate(PREFILL_HEAVY, busy, now=75.0) != []


def test_a_move_that_costs_next_to_nothing_needs_no_confirming():
    """A new batch on an idle cluster: nothing to drain, nothing cached, so the first decision acts."""
    idle = Allocator(IDS, additive(), AllocatorConfig(confirm=2, switch_s=0.0))
    assert idle.allocate(PREFILL_HEAVY, {e: 0.01 for e in IDS}, now=60.0) != []
    strict = Allocator(IDS, additive(), AllocatorConfig(confirm=2, switch_s=0.0, free_move=float("inf")))
    assert strict.allocate(PREFILL_HEAVY, {e: 0.01 for e in IDS}, now=60.0) == []


def test_a_draining_engine_is_charged_the_share_of_its_time_it_idles():
    """Draining, an engine keeps decoding what it holds while its batch empties: charged the idle
    share (`drain_idle`) of its drain time, a move that pays against that goes; charged the whole
    drain time as lost, the same move does not."""
    drain = {e: 12.0 for e in IDS}
    half = Allocator(IDS, additive(), AllocatorConfig(confirm=1, drain_idle=0.5))
    whole = Allocator(IDS, additive(), AllocatorConfig(confirm=1, drain_idle=1.0))
    assert half.allocate(PREFILL_HEAVY, drain, now=60.0) != [] and whole.allocate(PREFILL_HEAVY, drain, now=60.0) == []


def test_the_flip_time_weighs_against_a_move():
    cheap = Allocator(IDS, additive(), AllocatorConfig(confirm=1, switch_s=1.0))
    dear = Allocator(IDS, additive(), AllocatorConfig(confirm=1, switch_s=1e4))
    assert cheap.allocate(PREFILL_HEAVY, {}, now=60.0) != [] and dear.allocate(PREFILL_HEAVY, {}, now=60.0) == []


def test_routing_only_roles_switch_at_once_except_to_prefill():
    a = Allocator(IDS, additive(), AllocatorConfig(confirm=1, routing_only=True, response_kv_pushed=True))
    moves = a.allocate(PREFILL_HEAVY, {e: 5.0 for e in IDS}, now=60.0)
    # every engine was mixed: the ones bound for prefill drain their decodes, the ones bound for
    # decode switch at once, but not all of them: something must prefill until the drain ends
    assert any(m.new is Role.prefill for m in moves)
    for m in moves:
        want = EngineState.draining if m.new is Role.prefill else EngineState.ready
        assert a.engines[m.engine].state is want
    assert a.layout().mixed >= 1 and any(r.prefills for r in a.roles().values())
    for m in moves:
        if m.new is Role.prefill:
            a.drained(m.engine, 65.0)
    rest = a.allocate(PREFILL_HEAVY, {}, now=65.0)  # the second step of the same move: no new confirmation
    assert rest and not a.draining() and a.layout().mixed == 0


def test_a_move_is_charged_what_the_rest_lose_serving_alone_while_its_engines_drain():
    """Routing only, every engine mixed, a split wins: the engines bound for decode switch at once,
    the one bound for prefill drains, and until it has, one mixed engine prefills for the cluster.
    A short drain is worth it; a 30 s one is not (the rest serve the demand ~2.5x slower meanwhile),
    though the drained engine's own idle slots (`drain_idle` of 30 s) would have looked cheap."""
    def moves(drain: float) -> list:
        a = Allocator(IDS, additive(), AllocatorConfig(confirm=1, routing_only=True, response_kv_pushed=True))
        return a.allocate(PREFILL_HEAVY, {e: drain for e in IDS}, now=60.0)
    a = Allocator(IDS, additive())
    assert a.estimate(Layout(0, 6, 1), PREFILL_HEAVY) > 2 * a.estimate(Layout(0, 0, 8), PREFILL_HEAVY)
    assert moves(3.0) != [] and moves(30.0) == []


def test_allocate_holds_when_draining_costs_more_than_it_gains():
    a = Allocator(IDS, additive(), AllocatorConfig(confirm=1))
    assert a.allocate(PREFILL_HEAVY, {e: 1e4 for e in IDS}, now=60.0) == []
    assert a.allocate(PREFILL_HEAVY, {e: 0.0 for e in IDS}, now=60.0) != []


def test_allocate_respects_dwell():
    a = Allocator(IDS, additive(), AllocatorConfig(dwell_s=30, confirm=1))
    assert a.allocate(PREFILL_HEAVY, {}, now=10.0) == []  # every engine just started
    assert a.allocate(PREFILL_HEAVY, {}, now=31.0) != []


def _alternate(cfg: AllocatorConfig, seconds: float = 300.0) -> Allocator:
    """Demand flips between prefill-heavy and decode-only every 5 s; engines drain at once."""
    a = Allocator(IDS, additive(), cfg)
    t = 0.0
    while t < seconds:
        d = PREFILL_HEAVY if int(t / 5) % 2 == 0 else DECODE_ONLY
        for m in a.allocate(d, {}, t):
            a.drained(m.engine, t)
        t += 5.0
    return a


def test_hysteresis_does_not_flap():
    calm = _alternate(AllocatorConfig(dwell_s=60, margin=0.25))
    jumpy = _alternate(AllocatorConfig(dwell_s=0, margin=0.0, min_gain=0.0, switch_s=0.0, confirm=1))
    assert len(jumpy.history) > 2 * len(calm.history) and len(jumpy.history) >= 20
    last: dict[str, float] = {}
    for t, m in calm.history:  # no engine moves twice within the dwell time
        assert t - last.get(m.engine, -1e9) >= 60
        last[m.engine] = t


def test_never_drains_the_last_engine_of_a_kind():
    ids = ["a", "b"]
    a = Allocator(ids, additive(), AllocatorConfig(max_moves=1.0, dwell_s=0), initial=Layout(1, 1, 0))
    a.allocate(DECODE_ONLY, {}, now=1.0)  # wants both mixed, but both draining at once would serve nothing
    roles = a.roles().values()
    assert any(r.prefills for r in roles) and any(r.decodes for r in roles)


def test_capacity_fit_recovers_measured_step_times():
    true = [0.015, 2e-4, 6e-8, 2e-5, 0.004, 1e-6]  # a DP group: the first 2,048 tokens cost more than the rest
    cap = Capacity(prefill_tok_s=20_000, step=[0.010, 1e-4, 4e-8, 5e-5], ridge=5.0, chunk_tokens=16_384,
                   rank_tokens=2048)
    assert cap.prefill_rate() == 20_000  # no chunk seen yet: the prior
    truth = Capacity(step=true, chunk_tokens=16_384, rank_tokens=2048)
    rng = random.Random(0)
    for _ in range(4096):
        b, ctx = rng.randint(1, 256), rng.uniform(0, 4e5)
        k = rng.choice([0, 0, 2048, 16_384, rng.uniform(0, 16_384)])
        cap.observe_step(b, ctx, k, truth.step_s(b, ctx / b, k) * rng.uniform(0.97, 1.03))
    for b, ctx, k in ((1, 0, 0), (64, 2048, 0), (256, 1000, 0), (64, 2048, 512), (64, 2048, 2048), (0, 0, 16_384)):
        assert cap.step_s(b, ctx, k) == pytest.approx(truth.step_s(b, ctx, k), rel=0.05), (cap.step, true)
    assert cap.prefill_rate() == pytest.approx(16_384 / truth.step_s(0, 0, 16_384), rel=0.05)
    before = cap.prefill_rate()
    cap.observe_prefill(10_000, 1.0)  # a slow prefill timed end to end pulls the rate down a little
    assert 0.9 * before < cap.prefill_tok_s < before


def test_capacity_fit_weighs_short_and_long_steps_alike():
    """Decode steps of a few ms beside chunked steps of hundreds: fitted by relative error, the
    short ones are not swamped (by absolute error, toward a vague prior, they came out 10x off)."""
    truth = Capacity(step=[0.0057, 1.9e-6, 2.9e-9, 8.3e-6, 0.0021, 1.0e-6, 2.7e-9], chunk_tokens=16_384,
                     rank_tokens=2048)
    cap = Capacity(chunk_tokens=16_384, rank_tokens=2048)  # the vague default prior
    rng = random.Random(1)
    for _ in range(2048):
        b, per = rng.randint(1, 400), rng.uniform(500, 30_000)
        k = rng.choice([0, 0, 16_384, rng.uniform(0, 16_384)])
        prefix = rng.uniform(0, 60_000) if k else 0.0
        cap.observe_step(b, b * per, k, truth.step_s(b, per, k, prefix), prefix)
    for b, per in ((1, 1000), (64, 2000), (380, 15_000), (95, 15_000)):
        assert cap.step_s(b, per) == pytest.approx(truth.step_s(b, per), rel=0.05), cap.step
    assert cap.step_s(95, 15_000, 2048, 15_000) == pytest.approx(truth.step_s(95, 15_000, 2048, 15_000), rel=0.05)


def test_nothing_moves_on_a_forecast_that_is_still_mostly_prior():
    cfg = AllocatorConfig(confirm=1, min_observed=0.5, min_samples=64)
    a = Allocator(IDS, additive(), cfg)
    early = dataclasses.replace(PREFILL_HEAVY, observed=100)  # 100 responses seen, 1,000 live
    assert a.allocate(early, {}, now=60.0) == []  # and the capacity fit has seen no step yet
    a.capacity.refit_every = 1 << 30  # count the samples, keep the fit
    for _ in range(64):
        a.capacity.observe_step(64, 64 * 2048, 512, 0.02)
    assert a.allocate(early, {}, now=60.0) == []
    assert a.allocate(dataclasses.replace(PREFILL_HEAVY, observed=600), {}, now=60.0) != []


# --- what a turn's prefill attends to, bursts, and losses that last ---------------------------------
def moe_group() -> Capacity:
    """A DP8 MoE group as the simulator's steps fit it, with the attention-to-prefix term: a 2,048-
    token chunk on one rank after 17k cached tokens adds ~90 ms to every rank's step (9 ms alone)."""
    return Capacity(step=[0.0091, 9.8e-8, 3.0e-9, 1.05e-5, 0.0016, 7.2e-7, 2.54e-9], chunk_tokens=16_384,
                    rank_tokens=2048, kv_tokens=9.5e6)


def test_the_prefill_prefix_prices_what_a_turn_attends_to():
    """The turns that prefill most are the long conversations (long observations): their chunks
    attend to far more than the mean live context. Priced at the mean, colocation looked nearly as
    good as a split; priced at what prefill really attends to, the stalls it pays show."""
    ids = IDS[:4]
    at_mean = Demand(15, 7.5e5, 8.6e5, 512, 6700, prefill_arrivals=7.5e5, turns=144, live=512, mean_response=4000)
    long_turns = dataclasses.replace(at_mean, prefill_prefix=40_000)  # as forecast early in the `shift` workload
    a = Allocator(ids, moe_group(), AllocatorConfig(response_kv_pushed=True))
    colo, split = Layout(0, 0, 4), Layout(1, 3, 0)
    assert a.estimate(colo, long_turns) > 1.25 * a.estimate(colo, at_mean)
    assert a.estimate(split, long_turns) == a.estimate(split, at_mean)  # decode-bound: its prefill engine has room
    gain = {d.prefill_prefix: 1 - a.estimate(split, d) / a.estimate(colo, d) for d in (at_mean, long_turns)}
    assert gain[0.0] < 0.10 < 0.20 < gain[40_000]


def test_decode_is_priced_at_the_context_arriving_prefills_grow_it_to():
    """1.6M tokens of observations arrive within a 15-s horizon for 1,000 live conversations of 2k
    tokens. A move binds the engines for `dwell_s` (30 s: two horizons), over which each
    conversation gains 3.2k: decode is priced at 3.6k, the mean over that time. On a layout whose
    one decode engine bounds it, that is the whole estimate. Conversations ending within the
    horizon take their contexts away (1.2M: growth net of them is 0.4k a horizon, 2.4k priced); the
    same prefill already waiting (no arrivals: a burst) leaves the contexts as they are."""
    a = Allocator([f"e{i}" for i in range(16)], additive())
    decode_bound = Layout(15, 1, 0)
    arriving = Demand(15, 1.6e6, 2e6, 1000, 2000, prefill_arrivals=1.6e6, turns=1000, live=1000, mean_response=300)
    ending = dataclasses.replace(arriving, ending_context=1.2e6)
    waiting = dataclasses.replace(arriving, prefill_arrivals=0.0)
    assert a.config.dwell_s == 30.0
    assert a.estimate(decode_bound, arriving) == pytest.approx(2000 * a.capacity.step_s(1000, 3600))
    assert a.estimate(decode_bound, ending) == pytest.approx(2000 * a.capacity.step_s(1000, 2400))
    assert a.estimate(decode_bound, waiting) < 2000 * a.capacity.step_s(1000, 2100)
    # with one horizon as the least a move binds the engines, half a horizon's growth is priced
    once = Allocator([f"e{i}" for i in range(16)], additive(), AllocatorConfig(dwell_s=15.0))
    assert once.estimate(decode_bound, arriving) == pytest.approx(2000 * once.capacity.step_s(1000, 2800))


def test_a_burst_waiting_now_is_not_pipelined_by_a_split():
    """The same tokens as a stream (arriving over the horizon) and as a burst (all waiting now: a
    synchronous batch's first prompts). A split pipelines the stream; the burst's last turn decodes
    only once the prefill engines are through it, so no split ends before that plus one response."""
    cap = moe_group()
    a = Allocator(IDS[:4], cap, AllocatorConfig(response_kv_pushed=True))
    stream = Demand(15, 5.3e6, 2.4e5, 256, 20_000, prefill_arrivals=5.3e6, turns=256, live=256, mean_response=400,
                    prefill_prefix=10_000)
    burst = dataclasses.replace(stream, prefill_arrivals=0.0)
    split = Layout(2, 2, 0)
    one_response = (2.4e5 / 256) * cap.step_s(128, 20_000)
    assert a.estimate(split, burst) >= 5.3e6 / (2 * cap.prefill_rate(10_000)) + one_response
    assert a.estimate(split, burst) > a.estimate(split, stream)
    # colocation is never pipelined: a burst costs it no more than the stream (whose arrivals also
    # grow the contexts it decodes at; a burst's tokens are in the contexts already)
    assert a.estimate(Layout(0, 0, 4), burst) <= a.estimate(Layout(0, 0, 4), stream)
    assert a.plan(burst)[0] == Layout(0, 0, 4)


def test_a_loss_that_lasts_is_credited_for_as_long_as_it_has_lasted():
    """A move whose drain costs more than `payback_s` of its gain waits; once the current layout
    has been losing for longer, the loss is taken to last as long again and the move is made. A
    burst in between starts the count again."""
    cfg = AllocatorConfig(confirm=1, payback_s=10.0, dwell_s=0.0)
    drain = {e: 40.0 for e in IDS}  # every engine holds long decodes: a move is dear
    a = Allocator(IDS, additive(), cfg)
    assert a.allocate(PREFILL_HEAVY, drain, now=0.0) == []
    assert a.allocate(DECODE_ONLY, drain, now=5.0) == []  # a pause: the current layout is best again
    t = 10.0
    while not a.allocate(PREFILL_HEAVY, drain, now=t):
        t += 5.0
        assert t < 1000
    assert t > 20.0  # held at first: counted from 10 s, not from the first sighting at 0 s


def test_nothing_moves_in_a_rounds_tail():
    """A dense 8B's fit and demand as the simulator had them 140 s into Llama-3-8B `web` sync at 8
    GPUs, one trajectory left: a 2P6D split serves its turn 10% faster than colocation and is
    nearly free to move to. Moved to, the next round's 96 trajectories started in it and ran 19%
    slower. With no more trajectories than engines colocation has no interference to take away:
    nothing moves. The same demand from as many trajectories as engines moves (confirmed twice)."""
    cap = Capacity(step=[0.00512, 0.0, 3.0e-8, 2.38e-5, 0.00121, 0.0, 1.67e-9], chunk_tokens=2048, rank_tokens=2048,
                   kv_tokens=853_658)
    cfg = AllocatorConfig(switch_s=0.0, confirm=2, response_kv_pushed=True, routing_only=True)
    cached = {"e0": 49_380, "e5": 56_742, "e7": 97_964}
    idle = {e: 0.0 for e in IDS}
    for live, moved in ((1, False), (7, False), (8, True)):
        d = Demand(15, 3331, 107, 0.99, 97_964, prefill_arrivals=3331, turns=0.56, live=live, mean_response=106,
                   prefill_prefix=101_502, ending_context=94_442)
        a = Allocator(IDS, cap, cfg)
        assert a.plan(d)[0] == Layout(2, 6, 0) and a.plan(d)[1] < 0.9 * a.estimate(Layout(0, 0, 8), d)
        assert a.allocate(d, idle, now=135.0, cached=cached) == []
        assert (a.allocate(d, idle, now=140.0, cached=cached) != []) is moved


def _closed(cap: Capacity | None = None) -> Allocator:
    cap = cap or Capacity(step=[0.005, 0.0, 3e-8, 2.3e-5, 3e-4, 0.0, 1.7e-9], kv_tokens=850_000)  # a dense 8B's fit
    return Allocator(IDS, cap, AllocatorConfig(estimate="closed_loop", response_kv_pushed=True))


def _turns(tool_s: float, live: int, prefill: float = 5_000) -> Demand:
    """A steady async stream: `live` trajectories, turns of `prefill` tokens and 250-token responses."""
    turns = 0.6 * live
    return Demand(15, turns * prefill, turns * 250, live, 30_000, prefill_arrivals=turns * prefill, turns=turns,
                  live=live, mean_response=250, turn_prefill=prefill, turn_prefix=30_000, turn_response=250,
                  tool_s=tool_s)


def test_an_unknown_estimate_is_refused():
    with pytest.raises(ValueError, match="unknown estimate 'guess'"):
        Allocator(IDS, config=AllocatorConfig(estimate="guess"))


def test_the_closed_loop_estimate_needs_measured_turns_else_it_is_the_default():
    d = dataclasses.replace(_turns(2.0, 64), turn_prefill=0.0, turn_response=0.0, tool_s=0.0)  # nothing measured
    default = Allocator(IDS, _closed().capacity, AllocatorConfig(response_kv_pushed=True))
    for lay in (Layout(0, 0, 8), Layout(2, 6, 0), Layout(7, 1, 0)):
        assert _closed().estimate(lay, d) == default.estimate(lay, d)


def test_the_closed_loop_estimate_is_the_tools_time_when_the_engines_wait_on_the_tools():
    """Trajectories spending a minute in their tool a turn hardly load the engines: every layout
    serves a turn in a second or so, so each needs about turns · tool / live for the horizon."""
    a, d = _closed(), _turns(60.0, 64)
    floor = d.turns * d.tool_s / d.live
    for lay in (Layout(0, 0, 8), Layout(1, 7, 0), Layout(4, 4, 0)):
        assert floor < a.estimate(lay, d) < 1.05 * floor


def test_the_closed_loop_estimate_prices_interference_and_a_saturated_prefill_engine():
    """A DP-attention group, 1,000 trajectories with 2-s tools: colocated decodes stall behind
    every prefill chunk, so two prefill engines serve the loop faster; one cannot keep up, and its
    layout runs at the rate that engine prefills."""
    a, d = _closed(additive()), _turns(2.0, 1000)
    colo, split, lone = (a.estimate(lay, d) for lay in (Layout(0, 0, 8), Layout(2, 6, 0), Layout(1, 7, 0)))
    assert split < 0.85 * colo and colo < lone
    assert lone == pytest.approx(d.prefill_tokens / a.capacity.prefill_rate(d.turn_prefix), rel=0.02)


# --- engines of two sizes (a per-role launch) --------------------------------------------------
SMALL = ["e0", "e1", "e2", "e3"]  # four engines of 1 GPU, launched to prefill (ids in order: prefill first)
SIZES = {**{e: 1 for e in SMALL}, "e4": 4}  # ... for one decode engine of 4


def sized_dense(scale: float) -> Capacity:
    """A dense engine whose every step cost is `scale` times a base one's (a smaller TP: slower)."""
    return Capacity(step=[0.007 * scale, 3e-5 * scale, 1.6e-8 * scale, 3e-5 * scale, 0.004 * scale],
                    kv_tokens=240_000 if scale > 1 else 1.7e6)


def two_sizes(config: AllocatorConfig | None = None, slow: Capacity | None = None, fast: Capacity | None = None):
    slow, fast = slow or sized_dense(2.5), fast or sized_dense(1.0)
    return Allocator(SIZES, fast, config, Layout(4, 1, 0), sizes=SIZES, capacities={1: slow, 4: fast})


def test_engines_of_two_sizes_alike_in_speed_are_priced_as_one_size():
    same = sized_dense(1.0)
    a = two_sizes(slow=same, fast=same)
    uniform = Allocator(SIZES, same)
    for small, big in ((Layout(4, 0, 0), Layout(0, 1, 0)), (Layout(2, 2, 0), Layout(0, 1, 0)),
                       (Layout(0, 4, 0), Layout(1, 0, 0)), (Layout(1, 1, 2), Layout(0, 0, 1))):
        total = Layout(*(x + y for x, y in zip((small.prefill, small.decode, small.mixed),
                                               (big.prefill, big.decode, big.mixed))))
        for d in (PREFILL_HEAVY, DECODE_ONLY):
            assert a.estimate(((1, small), (4, big)), d) == pytest.approx(uniform.estimate(total, d))


def test_the_slowest_size_in_a_role_sets_its_pace():
    """The router gives each engine of a role an even share, whatever its size: four slow decode
    engines beside a fast one decode as five slow ones would; prefill engines of one size priced at
    it, as a launch is scored (`scheduler.launch`)."""
    slow, fast = sized_dense(2.5), sized_dense(1.0)
    a = two_sizes(slow=slow, fast=fast)
    five_slow = Allocator([f"e{i}" for i in range(5)], slow).estimate(Layout(0, 5, 0), DECODE_ONLY)
    assert a.estimate(((1, Layout(0, 4, 0)), (4, Layout(0, 1, 0))), DECODE_ONLY) == pytest.approx(five_slow)
    assert five_slow > Allocator([f"e{i}" for i in range(5)], fast).estimate(Layout(0, 5, 0), DECODE_ONLY)
    launch = Allocator(SIZES, fast, prefill_capacity=slow).estimate(Layout(4, 1, 0), PREFILL_HEAVY)
    assert a.estimate(((1, Layout(4, 0, 0)), (4, Layout(0, 1, 0))), PREFILL_HEAVY) == pytest.approx(launch)


def test_engines_of_two_sizes_move_between_prefill_and_decode_within_their_size():
    a = two_sizes(AllocatorConfig(confirm=1, dwell_s=0, routing_only=True), slow=sized_dense(1.2))
    assert a.sized() == ((1, Layout(4, 0, 0)), (4, Layout(0, 1, 0)))
    assert all(not x.mixed for lay in a.targets() for _, x in lay)  # no mixed engine beside another size
    assert len(a.targets()) == 5 * 2  # p of 0..4 small engines prefilling, the big one prefilling or not
    # a large decode batch: more engines decoding beat one fast one, even at the slow ones' pace
    many = Demand(horizon_s=15, prefill_tokens=0, decode_tokens=51_200, decode_seqs=512, mean_context=1000, live=512)
    assert a.estimate(((1, Layout(0, 4, 0)), (4, Layout(0, 1, 0))), many) < a.estimate(a.sized(), many) / 2
    small = a.estimate(((1, Layout(0, 4, 0)), (4, Layout(0, 1, 0))), DECODE_ONLY) / a.estimate(a.sized(), DECODE_ONLY)
    assert 0.9 < small < 1.0  # a small batch: the slow engines' pace takes back most of what they add...
    assert a.allocate(DECODE_ONLY, {e: 0.0 for e in SIZES}, now=10.0) == []  # ... under `min_gain`: no move
    moves = a.allocate(many, {e: 0.0 for e in SIZES}, now=10.0)
    assert moves and all(m.engine in SMALL and m.new is Role.decode for m in moves)  # the big one decodes already
    assert a.sized() == ((1, Layout(4 - len(moves), len(moves), 0)), (4, Layout(0, 1, 0)))
    assert a.sizes == SIZES
    with pytest.raises(ValueError, match="no size"):
        Allocator([*SIZES, "x"], sized_dense(1.0), sizes=SIZES, capacities={1: sized_dense(2.5)})
