"""Engine fleet with real engine processes: a killed engine leaves rotation within seconds
and its turns are retried on another engine, not lost."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import httpx
import pytest

from env_workers.client import LocalEnvs
from rollout_service.engines.fleet import Fleet
from rollout_service.rollout import run_episode
from scheduler.registry import Registry
from scheduler.roles import Role
from scheduler.router import StickyLeastLoaded
from scheduler.store import Work
from tests.conftest import free_port
from wire import EngineInfo, RolloutRequest


def start_sim(time_scale: float, port: int | None = None) -> tuple[subprocess.Popen, str]:
    port = port or free_port()
    proc = subprocess.Popen([sys.executable, "-m", "rollout_service.cli", "sim-engine", "--port", str(port),
                             "--time-scale", str(time_scale)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)


@pytest.fixture
def two_engines():
    procs = [start_sim(time_scale=3.0) for _ in range(2)]
    yield procs
    for p, _ in procs:
        p.kill()
        p.wait()


async def test_killed_engine_leaves_rotation_and_turns_move(two_engines, redis, keys):
    reg = Registry(redis, keys)
    for i, (_, url) in enumerate(two_engines):
        await reg.add_engine(EngineInfo(id=f"e{i}", url=url))
    fleet = Fleet(registry=reg, refresh_s=0)
    params = RolloutRequest(tasks=[{}], env="calc", max_turns=4)
    works = [Work(f"t-{i}", "t", i, 0, {"seed": i}, params) for i in range(8)]
    episodes = [asyncio.create_task(run_episode(w, fleet, LocalEnvs())) for w in works]
    await asyncio.sleep(0.3)  # trajectories are spread over both engines, mid-turn
    two_engines[0][0].kill()
    t_kill = time.monotonic()
    await fleet.probe()
    assert fleet.down == {"e0"} and time.monotonic() - t_kill < 5
    trajs = await asyncio.gather(*episodes)
    assert all(t.failure is None for t in trajs), [t.failure for t in trajs if t.failure]
    engines_used = {turn.engine_id for t in trajs for turn in t.turns}
    assert "e1" in engines_used
    late = [turn.engine_id for t in trajs for turn in t.turns[-1:]]
    assert all(e == "e1" for e in late)  # after the kill, everything finished on the survivor
    await fleet.aclose()


async def test_deregistered_engine_is_dropped_and_new_one_used(two_engines, redis, keys):
    reg = Registry(redis, keys)
    await reg.add_engine(EngineInfo(id="a", url=two_engines[0][1]))
    fleet = Fleet(registry=reg, refresh_s=0)
    await fleet.refresh(force=True)
    assert fleet.engine_ids == ["a"]
    await reg.add_engine(EngineInfo(id="b", url=two_engines[1][1]))
    await reg.remove_engine("a")
    await fleet.refresh(force=True)
    assert fleet.engine_ids == ["b"]
    await fleet.aclose()


def test_sticky_then_least_loaded():
    r = StickyLeastLoaded()
    assert r.pick("t1", {"a": 10, "b": 0}) == "b"
    assert r.pick("t1", {"a": 0, "b": 99}) == "b"  # sticky: its prefix is cached there
    assert r.pick("t2", {"a": 5, "b": 99}) == "a"  # new trajectory: fewest in-flight tokens
    r.forget("t1")
    assert r.pick("t1", {"a": 1, "b": 2}) == "a"
    assert r.pick("t3", {"b": 1}) == "b"  # a vanished engine is never picked


async def test_prefill_decode_split_hands_kv_over_and_matches_colocated(redis, keys, gateway):
    """Roles through the API; the decode engine receives the KV; tokens equal a colocated
    run's at temperature 0; then the roles switch and it runs the other way."""
    from rollout_service.engines.sim import SimEngine
    from rollout_service.engines.sim_server import create_app as sim_app
    from tests.conftest import LiveServer

    servers = [LiveServer(sim_app(SimEngine(f"e{i}", seed=7))) for i in range(2)]
    reg = Registry(redis, keys)
    try:
        for i, srv in enumerate(servers):
            srv.__enter__()
            await reg.add_engine(EngineInfo(id=f"e{i}", url=srv.url))

        async def episode(tid):
            fleet = Fleet(registry=reg, refresh_s=0)
            params = RolloutRequest(tasks=[{}], env="calc", max_turns=3,
                                    sampling={"temperature": 0.0, "max_tokens": 64})
            traj = await run_episode(Work(tid, "t", 0, 0, {"seed": 5}, params), fleet, LocalEnvs())
            await fleet.aclose()
            return traj

        def external(i):
            text = httpx.get(f"{servers[i].url}/metrics").text
            return float([ln for ln in text.splitlines() if "external_kv_transfer" in ln][0].split()[-1])

        colocated = await episode("same")
        with httpx.Client(base_url=gateway.url) as c:
            assert c.put("/v1/engines/e0/role", json={"role": "prefill"}).json()["role"] == "prefill"
            c.put("/v1/engines/e1/role", json={"role": "decode"})
        split = await episode("same")
        assert split.token_ids == colocated.token_ids and len(split.turns) >= 2
        assert all(t.engine_id == "e1" for t in split.turns) and external(1) > 0 and external(0) == 0

        with httpx.Client(base_url=gateway.url) as c:  # switch roles: no restart needed
            c.put("/v1/engines/e0/role", json={"role": "decode"})
            c.put("/v1/engines/e1/role", json={"role": "prefill"})
        switched = await episode("same")
        assert switched.token_ids == colocated.token_ids
        assert all(t.engine_id == "e0" for t in switched.turns) and external(0) > 0
        with httpx.Client(base_url=gateway.url) as c:
            assert c.put("/v1/engines/nope/role", json={"role": "decode"}).status_code == 404
            assert c.put("/v1/engines/e0/role", json={"role": "both"}).status_code == 422
    finally:
        for srv in servers:
            srv.__exit__(None, None, None)


async def test_engines_are_built_by_kind_and_unknown_kinds_are_skipped(redis, keys):
    reg = Registry(redis, keys)
    await reg.add_engine(EngineInfo(id="v", url="http://127.0.0.1:9"))
    await reg.add_engine(EngineInfo(id="x", url="http://127.0.0.1:9", kind="nope"))
    fleet = Fleet(registry=reg)
    await fleet.refresh(force=True)
    assert fleet.engine_ids == ["v"] and type(fleet._engines["v"][0]).__name__ == "VLLMEngine"
    await fleet.aclose()


async def test_a_vllm_engine_reports_prefill_from_the_per_request_metrics():
    """The vLLM-shaped sim server answers with `metrics` as vLLM does under
    --enable-per-request-metrics: the turn's prefill is the time to first token."""
    from rollout_service.engines.base import GenerateRequest
    from rollout_service.engines.sim import SimEngine
    from rollout_service.engines.sim_server import create_app as sim_app
    from rollout_service.engines.vllm import VLLMEngine, split_timing
    from wire import SamplingParams

    sim = SimEngine("s", seed=3)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=sim_app(sim)), base_url="http://sim")
    eng = VLLMEngine("v", "http://sim", client=client)
    prompt = list(b"<|im_start|>user\nwhat is 2 + 3?<|im_end|>\n")
    res = await eng.generate(GenerateRequest(prompt, SamplingParams(max_tokens=32, seed=1), "r1"))
    await client.aclose()
    assert res.prefill_s == pytest.approx(sim.cost.prefill_time(len(prompt)))
    assert res.decode_s == pytest.approx(sim.cost.decode_time(len(res.output_ids), 1))
    # A server without the metrics: all of it counts as decode, as before; a malformed block too.
    assert split_timing(None, 0.5) == (0.0, 0.5)
    assert split_timing({"time_to_first_token_ms": None}, 0.5) == (0.0, 0.5)
    assert split_timing({"time_to_first_token_ms": "x"}, 0.5) == (0.0, 0.5)
    assert split_timing({"time_to_first_token_ms": 100.0}, 0.5) == pytest.approx((0.1, 0.4))


class _Crowded:
    """A routing policy that moves every decode off the mixed engine that prefilled it (as RoleAware
    does when that engine is crowded)."""

    def route(self, trajectory_id, loads, roles):
        return "a", "b"

    def forget(self, trajectory_id):
        pass


async def test_a_decode_moves_off_a_mixed_engine_only_where_kv_can_follow():
    fleet = Fleet({"a": (None, "t"), "b": (None, "t")}, policy=_Crowded())
    assert await fleet._route("x", "t", None) == ("a", "a")  # connectors unknown: stay colocated
    fleet._infos = {e: EngineInfo(id=e, url="http://127.0.0.1:9", can_serve=["prefill", "decode", "mixed"])
                    for e in ("a", "b")}
    assert await fleet._route("x", "t", None) == ("a", "b")  # both hand KV over: split the turn
    fleet._infos["b"] = EngineInfo(id="b", url="http://127.0.0.1:9", can_serve=["mixed"])
    assert await fleet._route("x", "t", None) == ("a", "a")
    fleet._roles["a"] = Role.prefill  # a prefill engine's split is the role's, not the rebalancing's
    assert await fleet._route("x", "t", None) == ("a", "b")


async def test_a_split_left_without_its_decode_engine_says_what_took_it_out(two_engines, redis, keys):
    """Prefill on e0, decode on e1, and e1 dies: no engine is left to decode, and the turn's
    error names the failure that took e1 out (not only that nothing is available)."""
    reg = Registry(redis, keys)
    for i, (_, url) in enumerate(two_engines):
        await reg.add_engine(EngineInfo(id=f"e{i}", url=url))
    await reg.set_role("e0", Role.prefill.value)
    await reg.set_role("e1", Role.decode.value)
    two_engines[1][0].kill()
    two_engines[1][0].wait()
    fleet = Fleet(registry=reg, refresh_s=0)
    traj = await run_episode(Work("t-0", "t", 0, 0, {"seed": 0}, RolloutRequest(tasks=[{}], env="calc", max_turns=2)),
                             fleet, LocalEnvs())
    await fleet.aclose()
    assert traj.failure is not None
    assert "no engine available" in traj.failure.message and "the last attempt" in traj.failure.message
    assert "e1" in fleet.down, traj.failure.message


async def test_an_engine_that_refuses_a_request_is_asked_once_and_stays_in_rotation():
    """An engine's 400 is about the request: asking again, there or elsewhere, gets the same answer.
    It was retried on every engine and marked each down (one tenant's bad request took the engines
    from everyone until the next probe), then charged as an engine failure and retried 3 times."""
    from rollout_service.engines.base import EngineRejected, GenerateRequest
    from rollout_service.engines.vllm import VLLMEngine
    from wire import FailureKind, SamplingParams, TrajectoryState

    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m", "max_model_len": 4096}]})
        return httpx.Response(400, json={"error": {"message": "a request this engine does not take", "code": 400}})

    engines = {f"v{i}": (VLLMEngine(f"v{i}", f"http://e{i}", model="m",
                                    client=httpx.AsyncClient(transport=httpx.MockTransport(handler))), "byte")
               for i in range(2)}
    fleet = Fleet(engines)
    with pytest.raises(EngineRejected, match="does not take"):
        await fleet.generate("t1", "byte", GenerateRequest([1, 2, 3], SamplingParams(max_tokens=4), "r1"))
    assert calls.count("/v1/completions") == 1 and not fleet.down
    work = Work("b-0-0", "b", 0, 0, {"seed": 1}, RolloutRequest(tasks=[{}], env="math"))
    traj = await run_episode(work, fleet, LocalEnvs())
    assert traj.state is TrajectoryState.failed and traj.failure.kind is FailureKind.rejected
    assert "does not take" in traj.failure.message and calls.count("/v1/completions") == 2 and not fleet.down


async def test_a_conversation_that_fills_the_engines_context_ends_truncated_not_failed():
    """vLLM refuses `max_tokens` beyond its context (`max_model_len`) and a prompt that fills it:
    with SmolLM2 (4,096) and the default `max_total_tokens` (8,192), a long episode failed as an
    engine error, three attempts over. The engine now asks its context once, cuts `max_tokens` to
    what the prompt leaves, and a prompt with no room left ends the trajectory, truncated."""
    from rollout_service.engines.sim import SimEngine
    from rollout_service.engines.sim_server import create_app as sim_app
    from rollout_service.engines.vllm import VLLMEngine
    from wire import SamplingParams, TrajectoryState

    def fleet_of(max_model_len: int, policy=None) -> Fleet:
        sim = SimEngine("s", seed=3, **({"policy": policy} if policy else {}))
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=sim_app(sim, max_model_len=max_model_len)),
                                   base_url="http://sim")
        return Fleet({"v": (VLLMEngine("v", "http://sim", model="sim", client=client), "byte")})

    def work(env: str, **params) -> Work:
        return Work("b-0-0", "b", 0, 0, {"seed": 1}, RolloutRequest(tasks=[{}], env=env, **params))

    # max_tokens far beyond the context: cut to what is left, not refused
    fleet = fleet_of(4096)
    one = await run_episode(work("math", sampling=SamplingParams(max_tokens=32_768), max_total_tokens=100_000),
                            fleet, LocalEnvs())
    assert one.state is TrajectoryState.completed and one.turns and not fleet.down
    # a tool-calling policy that never answers: the conversation grows until the context is full
    fleet = fleet_of(400, policy=lambda prompt, rng: "calc: 1 + 1")
    long = await run_episode(work("calc", sampling=SamplingParams(max_tokens=64), max_turns=50,
                                  max_total_tokens=100_000), fleet, LocalEnvs())
    assert long.state is TrajectoryState.truncated and long.info["truncated_by"] == "context"
    assert len(long.turns) >= 2 and long.failure is None
    assert sum(len(t.prompt_ids) + len(t.output_ids) for t in long.turns) <= 400
    # a first prompt that does not fit at all
    none = await run_episode(work("math"), fleet_of(10), LocalEnvs())
    assert none.state is TrajectoryState.truncated and not none.turns and none.info["truncated_by"] == "context"


async def test_an_engine_back_from_down_is_asked_its_context_again():
    """The context is asked once; an engine that went down and came back may have restarted with
    another `--max-model-len`, so the probe that sees it back makes the next request ask again."""
    from rollout_service.engines.base import GenerateRequest
    from rollout_service.engines.vllm import VLLMEngine
    from wire import SamplingParams

    state = {"up": True, "len": 64, "asked": 0, "max_tokens": []}

    def handler(request: httpx.Request) -> httpx.Response:
        if not state["up"]:
            raise httpx.ConnectError("down")
        if request.url.path == "/health":
            return httpx.Response(200)
        if request.url.path == "/v1/models":
            state["asked"] += 1
            return httpx.Response(200, json={"data": [{"id": "m", "max_model_len": state["len"]}]})
        body = __import__("json").loads(request.content)
        state["max_tokens"].append(body["max_tokens"])
        return httpx.Response(200, json={"choices": [{"token_ids": [5], "logprobs": {"token_logprobs": [-0.1]},
                                                      "finish_reason": "length", "prompt_token_ids": body["prompt"]}]})

    eng = VLLMEngine("v", "http://e", model="m", client=httpx.AsyncClient(transport=httpx.MockTransport(handler)))
    fleet = Fleet({"v": (eng, "byte")})
    req = GenerateRequest(list(range(10)), SamplingParams(max_tokens=1000), "r")
    await fleet.generate("t", "byte", req)
    await fleet.generate("t", "byte", req)
    assert state["asked"] == 1 and state["max_tokens"] == [54, 54]
    state["up"] = False
    await fleet.probe()
    assert "v" in fleet.down
    state.update(up=True, len=128)
    await fleet.probe()
    await fleet.generate("t", "byte", req)
    assert state["asked"] == 2 and state["max_tokens"][-1] == 118 and not fleet.down


@pytest.mark.parametrize("answer", [{"data": {"a": 1}}, {"data": [1, "x"]}, {"nope": 1}, "not json",
                                    {"data": [{"id": "m", "max_model_len": True}]},
                                    {"data": [{"id": "m", "max_model_len": -5}]}])
async def test_a_server_that_does_not_say_its_context_is_served_without_a_limit(answer):
    """Not every OpenAI-compatible server says `max_model_len`, or says it well: no limit, no error."""
    from rollout_service.engines.vllm import VLLMEngine

    reply = httpx.Response(200, text=answer) if isinstance(answer, str) else httpx.Response(200, json=answer)
    eng = VLLMEngine("v", "http://e", model="m", client=httpx.AsyncClient(transport=httpx.MockTransport(lambda r: reply)))
    assert await eng.context_limit() is None


async def test_an_engine_whose_tokenizer_cannot_load_is_passed_over_and_marks_expire(monkeypatch):
    """One engine registered with a tokenizer folder that does not load took every new session
    routed to it (a 503 each, for good: the gateway never probes), while a good engine stood by.
    It is left out like a failing engine and the next one serves; a down mark lapses after
    DOWN_S where no probe renews it, so a process without a prober tries the engine again."""
    from rollout_service.engines import fleet as fleet_mod
    from rollout_service.engines.base import EngineError
    from rollout_service.engines.sim import SimEngine

    fleet = Fleet({"bad": (SimEngine("bad"), "/no/such/tokenizer"), "good": (SimEngine("good"), "byte")})
    for i in range(6):
        spec, tok, _ = await fleet.chat_for(f"s-{i}")
        assert spec == "byte" and tok is not None
    assert fleet.down == {"bad"}
    monkeypatch.setattr(fleet_mod, "DOWN_S", 0.05)
    await asyncio.sleep(0.1)
    assert fleet.down == set()  # tried again from here on (and left out again if still bad)
    assert (await fleet.chat_for("s-9"))[0] == "byte" and fleet.down == {"bad"}
    only_bad = Fleet({"bad": (SimEngine("bad"), "/no/such/tokenizer")})
    with pytest.raises(EngineError, match="tokenizer '/no/such/tokenizer' cannot be loaded"):
        await only_bad.chat_for("s-0")
    await fleet.aclose()
    await only_bad.aclose()


async def test_a_fleet_whose_engines_only_prefill_serves_no_turn_and_says_why(redis, keys):
    """With only prefill engines a turn failed as "no engine registered"; it says what is missing."""
    from rollout_service.engines.base import EngineError

    reg = Registry(redis, keys)
    fleet = Fleet(registry=reg, refresh_s=0)
    await fleet.refresh()
    assert not fleet.serves_turns()
    await reg.add_engine(EngineInfo(id="p", url="http://127.0.0.1:9", role="prefill"))
    await fleet.refresh()
    assert fleet.engine_ids == ["p"] and not fleet.serves_turns()
    with pytest.raises(EngineError, match="no engine takes decode"):
        await fleet.chat_for("t-0")
    await reg.add_engine(EngineInfo(id="d", url="http://127.0.0.1:9", role="decode"))
    await fleet.refresh()
    assert fleet.serves_turns()
    await fleet.aclose()


async def test_an_engine_restarted_after_a_weight_push_runs_no_turn_until_its_weights_are_back(redis, keys):
    """An engine that restarts comes back with its launch weights while the registry names the
    version pushed since: its turns went out labelled with a policy they were not sampled from.
    Now the fleet keeps it out of rotation until a gateway's keeper loads the pushed weights into
    it again; then it samples exactly as before the restart, under the same version."""
    from rollout_service.weights import WeightKeeper, WeightUpdater
    from wire import SamplingParams, WeightUpdate

    proc, url = start_sim(time_scale=0)
    reg = Registry(redis, keys)
    await reg.add_engine(EngineInfo(id="e0", url=url))
    fleet = Fleet(registry=reg, refresh_s=0)
    params = RolloutRequest(tasks=[{}], env="math", sampling=SamplingParams(seed=7))

    async def sampled() -> tuple[list[int], int]:
        traj = await run_episode(Work("t-0", "t", 0, 0, {"seed": 3}, params), fleet, LocalEnvs())
        assert traj.failure is None, traj.failure
        return traj.turns[0].output_ids, traj.turns[0].policy_version

    try:
        await fleet.probe()
        launched, _ = await sampled()
        assert (await WeightUpdater(reg).update(WeightUpdate(path="/ckpt/step-1"))).ok
        pushed, version = await sampled()
        assert version == 1 and pushed != launched  # (the simulated engine's weights: a seed from the path)
        loaded_at = (await reg.engine("e0")).weights.engine_started_at
        assert loaded_at is not None

        proc.kill()
        proc.wait()
        await fleet.probe()
        assert "e0" in fleet.down
        await asyncio.sleep(0.05)  # (a start time a moment later)
        proc, _ = start_sim(time_scale=0, port=int(url.rsplit(":", 1)[1]))
        await fleet.probe()  # up and answering, but with its launch weights
        assert "e0" in fleet.down and (await reg.engine("e0")).policy_version == 1
        # not even as the last engine left (a down one is tried when all are): no turn, uncharged
        from rollout_service.engines.base import EngineLost
        with pytest.raises(EngineLost, match="restarted"):
            await fleet.chat_for("t-1")
        assert not fleet.serves_turns()  # (a worker claims nothing meanwhile)

        keeper = WeightKeeper(reg, keys, gateway_fleet := Fleet(registry=reg, refresh_s=0))
        assert await keeper.once() == ["e0"]
        info = await reg.engine("e0")
        assert info.policy_version == 1 and info.weights.path == "/ckpt/step-1"
        assert info.weights.engine_started_at > loaded_at
        await fleet.probe()
        assert not fleet.down
        assert await sampled() == (pushed, 1)
        assert await keeper.once() == []  # nothing more to do
        await gateway_fleet.aclose()
    finally:
        proc.kill()
        proc.wait()
        await fleet.aclose()
