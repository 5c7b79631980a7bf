"""The live allocation loop against a real Redis: workers' forecasts in, roles out,
draining before a switch, and routers that stop sending work to a draining engine."""

from __future__ import annotations

import time

import pytest

from rollout_service.engines.fleet import Fleet
from rollout_service.engines.sim import SimEngine
from scheduler.allocator import AllocatorConfig, Capacity
from scheduler.forecast import Demand
from scheduler.pd_control import PDController
from scheduler.registry import Registry
from scheduler.timing import TurnTiming
from wire import EngineInfo

IDS = [f"e{i}" for i in range(8)]
ALL = ["prefill", "decode", "mixed"]
PREFILL_HEAVY = {"forecast:prefill_tokens": 2_000_000, "forecast:decode_tokens": 64_000, "forecast:decode_seqs": 64,
                 "forecast:context_tokens": 64_000, "forecast:live": 64, "forecast:turns": 64,
                 "forecast:response_tokens": 64 * 300, "forecast:prefill_arrivals": 2_000_000}


def additive() -> Capacity:
    return Capacity(prefill_tok_s=20_000, step=[0.010, 1e-4, 4e-8, 5e-5, 0.020])  # a chunk-carrying step stalls


def test_demand_sums_workers_and_weights_means():
    d = Demand.from_report({**PREFILL_HEAVY, "forecast:live": 32, "forecast:context_tokens": 64_000}, 10.0)
    assert d.prefill_tokens == 2_000_000 and d.live == 32 and d.mean_context == 2000.0


async def test_controller_drains_then_switches_and_routers_follow(redis, keys):
    reg = Registry(redis, keys)
    for eid in IDS:
        await reg.add_engine(EngineInfo(id=eid, url=f"http://127.0.0.1:9/{eid}", can_serve=ALL))
    now = [100.0]
    ctl = PDController(reg, additive(), AllocatorConfig(dwell_s=0, confirm=1, max_moves=0.25),
                       clock=lambda: now[0])
    assert await ctl.step() == []  # no forecast reported yet: nothing to move for
    await reg.report_phases("w1", PREFILL_HEAVY)
    await reg.report("w1", {"e0": 5000}, set())  # some engine is busy: it costs more to drain
    moves = await ctl.step()
    assert moves and all(m.new.value == "prefill" for m in moves) and "e0" not in {m.engine for m in moves}
    states = {e.id: e.state for e in await reg.engines()}
    moving = [m.engine for m in moves]
    assert all(states[e] == "draining" for e in moving)

    fleet = Fleet({eid: (SimEngine(eid), "byte") for eid in IDS}, registry=reg, refresh_s=0)
    await fleet.refresh(force=True)
    for i in range(20):  # new trajectories never land on a draining engine
        assert fleet.policy.route(f"t{i}", fleet._available("byte"), fleet.roles)[0] not in moving

    now[0] += 5
    await ctl.step()  # nothing in flight on them: the drain completes
    infos = {e.id: e for e in await reg.engines()}
    assert all(infos[e].role == "prefill" and infos[e].state == "ready" for e in moving)
    await fleet.refresh(force=True)
    loads = fleet._available("byte")
    for i in range(20):  # prefill-only engines never decode
        assert fleet.policy.route(f"u{i}", loads, fleet.roles)[1] not in moving
    # a prefill on a prefill-only engine hands its decode to another engine
    assert fleet.policy.pick_decode("fresh", loads, moving[0], fleet.roles) not in moving
    await fleet.aclose()


async def test_a_new_controller_releases_drains_an_earlier_one_left(redis, keys):
    """The plan behind a drain lives in the allocator; one that restarted (or saw the engine set
    change) serves the published role again rather than leave the engine idle forever."""
    reg = Registry(redis, keys)
    for eid in IDS:
        await reg.add_engine(EngineInfo(id=eid, url=f"http://127.0.0.1:9/{eid}", can_serve=ALL, role="decode"))
    await reg.drain("e1")
    assert (await reg.engine("e1")).state == "draining"
    await PDController(reg, additive(), AllocatorConfig(dwell_s=0), clock=lambda: 100.0).step()
    e1 = await reg.engine("e1")
    assert e1.state == "ready" and e1.role == "decode"


async def test_a_new_controller_finishes_a_drain_toward_its_published_next_role(redis, keys):
    """Killed while an engine drains: the next role is in the registry, so the next allocator
    keeps the engine draining while it holds work and gives it that role once it is empty."""
    reg = Registry(redis, keys)
    for eid in IDS:
        await reg.add_engine(EngineInfo(id=eid, url=f"http://127.0.0.1:9/{eid}", can_serve=ALL, role="mixed"))
    await reg.drain("e1", "prefill")
    await reg.report("w0", {"e1": 500}, set())  # e1 still holds 500 tokens of work
    cfg = AllocatorConfig(dwell_s=1e9)  # no new moves: only the inherited one
    await PDController(reg, additive(), cfg, clock=lambda: 100.0).step()
    e1 = await reg.engine("e1")
    assert (e1.state, e1.role, e1.next_role) == ("draining", "mixed", "prefill")
    await reg.report("w0", {"e1": 0}, set())
    ctl = PDController(reg, additive(), cfg, clock=lambda: 101.0)  # and once more restarted
    await ctl.step()
    e1 = await reg.engine("e1")
    assert (e1.state, e1.role, e1.next_role) == ("ready", "prefill", None)


async def test_only_engines_that_can_serve_every_role_are_moved(redis, keys):
    """An engine whose KV connector allows fewer roles (kv_producer, none, or not asked yet)
    keeps its role however much the forecast asks for prefill engines."""
    reg = Registry(redis, keys)
    kinds = [ALL] * 6 + [["prefill", "mixed"], ["mixed"], None]
    for i, can in enumerate(kinds):
        await reg.add_engine(EngineInfo(id=f"e{i}", url=f"http://127.0.0.1:9/e{i}", can_serve=can))
    await reg.report_phases("w0", PREFILL_HEAVY)
    ctl = PDController(reg, additive(), AllocatorConfig(dwell_s=0, confirm=1), clock=lambda: 100.0)
    moves = await ctl.step()
    assert moves and {m.engine for m in moves} <= set(IDS[:6])
    assert set(ctl.allocator.engines) == set(IDS[:6])
    for eid in ("e6", "e7", "e8"):
        e = await reg.engine(eid)
        assert (e.role, e.state, e.next_role) == ("mixed", "ready", None)


async def test_a_measuring_controller_learns_engine_speed_from_reported_turns(redis, keys):
    """Workers report each turn's timings; the controller takes them once and fits its capacity:
    a prefill engine's measured rate replaces the prior, decode steps reach the step fit."""
    reg = Registry(redis, keys)
    for eid in ("e0", "e1"):
        await reg.add_engine(EngineInfo(id=eid, url=f"http://127.0.0.1:9/{eid}", can_serve=ALL))
    for i in range(64):  # 1,000 new tokens in 0.5 s: 2,000 tok/s; 33 tokens decoded in 1.28 s at a batch of 4
        await reg.report_timing(TurnTiming("e0", 1000, 3000, 33, 0.5, 1.28, 4, True))
    await reg.report_timing(TurnTiming("e1", 500, 500, 10, 0.1, 0.09, 8, False))  # batched prefill: not a rate
    ctl = PDController(reg, clock=lambda: 100.0, measure=True)
    prior, prior_step = ctl.capacity.prefill_rate(), ctl.capacity.step_s(4, 3016)
    await ctl.step()
    assert ctl.capacity.samples == 65 and await reg.take_timings() == []
    assert abs(ctl.capacity.prefill_rate() - 2000) < abs(prior - 2000) and ctl.capacity.prefill_rate() < prior
    assert abs(prior_step - 0.04) > 0.02 and abs(ctl.capacity.step_s(4, 3016) - 0.04) < 0.004  # measured: 40 ms
    assert (await PDController(reg, clock=lambda: 100.0).step()) == [] and ctl.capacity.samples == 65


def test_turn_timings_survive_the_wire():
    t = TurnTiming("e0", 10, 20, 3, 0.25, 0.5, 2, True)
    assert TurnTiming.loads(t.dumps()) == t and TurnTiming.loads(t.dumps().encode()) == t


async def test_the_allocator_charges_no_recompute_where_every_engine_reads_the_response_back(redis, keys):
    reg = Registry(redis, keys)
    for eid in IDS[:2]:
        await reg.add_engine(EngineInfo(id=eid, url=f"http://127.0.0.1:9/{eid}", can_serve=ALL, kv_read_back=True))
    ctl = PDController(reg, additive(), AllocatorConfig(dwell_s=0), clock=lambda: 100.0)
    await ctl.step()
    assert ctl.allocator.config.response_kv_pushed and not ctl.config.response_kv_pushed
    await reg.add_engine(EngineInfo(id="e2", url="http://127.0.0.1:9/e2", can_serve=ALL))  # one that cannot
    await ctl.step()
    assert not ctl.allocator.config.response_kv_pushed


def test_the_responses_learned_travel_with_the_report():
    """A live allocator with `min_observed` reads how much the forecasters have learned from the
    workers' summed reports (it once read 0 and never moved)."""
    d = Demand(10.0, 100, 50, 4, 20.0, turns=4, live=4, mean_response=5, observed=7)
    twice = {k: 2 * v for k, v in d.report().items()}
    assert Demand.from_report(twice, 10.0).observed == 14


async def test_two_engines_reach_a_split_without_a_moment_when_nothing_decodes(redis, keys):
    """Roles are routing on engines that serve every role: the one bound for decode switches at
    once, the one bound for prefill drains first. (Draining both left nothing to decode, so two
    engines could never split.)"""
    reg = Registry(redis, keys)
    for eid in IDS[:2]:
        await reg.add_engine(EngineInfo(id=eid, url=f"http://127.0.0.1:9/{eid}", can_serve=ALL))
    short_turns = {"forecast:prefill_tokens": 52, "forecast:decode_tokens": 16, "forecast:decode_seqs": 4,
                   "forecast:context_tokens": 252, "forecast:turns": 4, "forecast:live": 4,
                   "forecast:response_tokens": 16, "forecast:observed": 100}
    await reg.report_phases("w0", short_turns)
    now = [100.0]
    ctl = PDController(reg, additive(), AllocatorConfig(dwell_s=0, confirm=1), clock=lambda: now[0])
    for _ in range(6):
        await ctl.step()
        infos = await reg.engines()
        assert any(e.state == "ready" and e.role in ("decode", "mixed") for e in infos)
        now[0] += 1.0
    assert sorted(e.role for e in await reg.engines()) == ["decode", "prefill"]


def test_rollout_allocator_names_the_estimate(capsys):
    """`rollout allocator --estimate`: every estimate the allocator knows, by name; anything else is
    a usage error that lists them."""
    from rollout_service.cli import build_parser
    from scheduler.allocator import ESTIMATES

    parser = build_parser()
    assert parser.parse_args(["allocator"]).estimate == "throughput"
    for name in ESTIMATES:
        assert parser.parse_args(["allocator", "--estimate", name]).estimate == name
    with pytest.raises(SystemExit) as e:
        parser.parse_args(["allocator", "--estimate", "guess"])
    assert e.value.code == 2 and "closed_loop" in capsys.readouterr().err
    assert parser.parse_args(["allocator"]).move_sizes is False
    assert parser.parse_args(["allocator", "--move-sizes"]).move_sizes is True


async def test_the_controller_keeps_what_launch_planning_reads(redis, keys):
    """Each decision's demand while there is work, and the measured step model under each size
    (engines of two sizes: each size fitted to its own engines' turns, neither to the other's)."""
    reg = Registry(redis, keys)
    for eid in ("e0", "e1"):
        await reg.add_engine(EngineInfo(id=eid, url=f"http://127.0.0.1:9/{eid}", model="m", gpus=4, can_serve=ALL))
    for _ in range(64):
        await reg.report_timing(TurnTiming("e0", 1000, 3000, 33, 0.5, 1.28, 4, True))
    ctl = PDController(reg, clock=lambda: 100.0, measure=True)
    await ctl.step()
    assert await reg.phase() == []  # no work reported: an idle cluster's decisions are not a phase
    await reg.report_phases("w1", PREFILL_HEAVY)
    await ctl.step()
    await ctl.step()
    phase = await reg.phase()
    assert len(phase) == 2 and phase[0] == Demand.from_report(PREFILL_HEAVY, ctl.horizon_s)
    saved = await reg.profiles("m")
    assert list(saved) == [4] and saved[4].step == ctl.capacity.step and saved[4].samples == 64
    assert saved[4].prefill_rate() == ctl.capacity.prefill_rate()
    assert await reg.phase(since=time.time() + 60) == []  # only decisions from then on

    await reg.add_engine(EngineInfo(id="e2", url="http://127.0.0.1:9/e2", model="m", gpus=1, can_serve=ALL))
    for _ in range(64):
        await reg.report_timing(TurnTiming("e2", 1000, 3000, 33, 0.1, 0.3, 4, True))
    await ctl.step()
    saved = await reg.profiles("m")
    assert sorted(saved) == [1, 4] and saved[4].samples == 64 and saved[4].step == ctl.capacity.step  # kept as it was
    assert saved[1].samples == 64 and saved[1].step_s(4, 3016) < saved[4].step_s(4, 3016) / 3  # e2's own, ~4x faster
    for eid in ("e0", "e1"):  # relaunched at 1 GPU like e2: one size again, its saved fit taken at once
        await reg.add_engine(EngineInfo(id=eid, url=f"http://127.0.0.1:9/{eid}", model="m", gpus=1, can_serve=ALL))
    await ctl.step()
    assert not ctl.capacities and ctl._launch == ("m", 1) and ctl.capacity.step == saved[1].step
    assert ctl.allocator.capacity is ctl.capacity


async def test_the_phase_record_is_capped(redis, keys):
    reg = Registry(redis, keys)
    d = Demand.from_report(PREFILL_HEAVY, 10.0)
    for i in range(5):
        await reg.record_phase(d, at=float(i), keep=3)
    assert len(await reg.phase()) == 3 and len(await reg.phase(since=3.0)) == 2


async def test_engines_launched_at_another_size_are_measured_afresh(redis, keys):
    """The old size's fit is not carried into the new launch's profile; coming back to a size
    starts from what was saved for it."""
    reg = Registry(redis, keys)

    async def launch(gpus: int) -> None:
        for eid in ("e0", "e1"):
            await reg.add_engine(EngineInfo(id=eid, url=f"http://127.0.0.1:9/{eid}", model="m", gpus=gpus,
                                            can_serve=ALL))

    await launch(4)
    for _ in range(64):
        await reg.report_timing(TurnTiming("e0", 1000, 3000, 33, 0.5, 1.28, 4, True))
    ctl = PDController(reg, clock=lambda: 100.0, measure=True)
    await ctl.step()
    at4 = ctl.capacity.step
    await launch(2)  # relaunched at TP2, twice as slow a step
    for _ in range(64):
        await reg.report_timing(TurnTiming("e0", 1000, 3000, 33, 1.0, 2.56, 4, True))
    await ctl.step()
    saved = await reg.profiles("m")
    assert saved[4].step == at4 and ctl.capacity.samples == 64 and saved[2].samples == 64
    assert saved[2].step_s(4, 3016) > 1.5 * saved[4].step_s(4, 3016)
    await launch(4)  # back at TP4: from the saved fit, not a fresh one
    await ctl.step()
    assert ctl.capacity.samples == 64 and ctl.capacity.step == at4 and ctl.allocator.capacity is ctl.capacity


async def _two_sizes(reg: Registry) -> dict[str, int]:
    for i in range(4):
        await reg.add_engine(EngineInfo(id=f"p{i}", url=f"http://127.0.0.1:9/p{i}", gpus=1, role="prefill",
                                        can_serve=ALL))
    await reg.add_engine(EngineInfo(id="d0", url="http://127.0.0.1:9/d0", gpus=4, role="decode", can_serve=ALL))
    decode_only = {"forecast:decode_tokens": 64_000, "forecast:decode_seqs": 64, "forecast:context_tokens": 64_000,
                   "forecast:live": 64}  # turns prefill engines to decode where they may move
    await reg.report_phases("w1", decode_only)
    return decode_only


async def test_a_launch_of_two_sizes_keeps_its_roles_by_default(redis, keys):
    """Prefill engines of 1 GPU for a decode engine of 4 (a per-role launch): without `move_sizes` no
    engine moves; the demand is still recorded for the next plan."""
    reg = Registry(redis, keys)
    await _two_sizes(reg)
    ctl = PDController(reg, additive(), AllocatorConfig(dwell_s=0, confirm=1), clock=lambda: 100.0)
    for _ in range(3):
        assert await ctl.step() == []
    assert {e.id: (e.role, e.state) for e in await reg.engines()} == {
        **{f"p{i}": ("prefill", "ready") for i in range(4)}, "d0": ("decode", "ready")}
    assert len(await reg.phase()) == 3


async def test_a_launch_of_two_sizes_moves_roles_within_each_size_when_asked(redis, keys):
    """`move_sizes`: a decode-only demand turns prefill engines to decode, never to mixed; each keeps
    its size, the allocator knows every engine's, and the demand is still recorded."""
    reg = Registry(redis, keys)
    await _two_sizes(reg)
    ctl = PDController(reg, additive(), AllocatorConfig(dwell_s=0, confirm=1), clock=lambda: 100.0, move_sizes=True)
    moves = await ctl.step()
    assert moves and all(m.engine.startswith("p") and (m.old.value, m.new.value) == ("prefill", "decode")
                         for m in moves)
    assert ctl.allocator.sizes == {**{f"p{i}": 1 for i in range(4)}, "d0": 4}
    engines = {e.id: e for e in await reg.engines()}
    assert all((engines[m.engine].role, engines[m.engine].state) == ("decode", "ready") for m in moves)  # routing only
    assert {e.role for e in engines.values()} <= {"prefill", "decode"} and engines["d0"].gpus == 4
    assert len(await reg.phase()) == 1
    for i in range(4):  # relaunched alike: allocated as one size again
        await reg.add_engine(EngineInfo(id=f"p{i}", url=f"http://127.0.0.1:9/p{i}", gpus=4, role="prefill",
                                        can_serve=ALL))
    await ctl.step()
    assert ctl.allocator.sizes is None and not ctl.capacities
