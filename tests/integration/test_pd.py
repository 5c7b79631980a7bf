"""Prefill/decode disaggregation for real: two vLLM CPU engines with NixlConnector, a
multi-turn episode routed prefill -> decode through the service, the KV received by the
decode engine, tokens equal to a colocated run at temperature 0; then the roles switch."""

from __future__ import annotations

import httpx
import pytest

from env_workers.client import LocalEnvs
from rollout_service.engines.fleet import Fleet
from rollout_service.local import vllm_local
from rollout_service.rollout import run_episode
from scheduler.registry import Registry
from scheduler.store import Work
from tests.conftest import free_port
from wire import EngineInfo, RolloutRequest

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def two_kv_engines():
    vllm_local.ensure_nixl()
    path = vllm_local.prepare_model("tiny")
    ports = [free_port(), free_port()]
    procs = [vllm_local.start_server(path, p, "tiny", kv_transfer=True) for p in ports]
    try:
        for p, proc in zip(ports, procs):
            vllm_local.wait_ready(f"http://127.0.0.1:{p}", 300, proc)
        yield [f"http://127.0.0.1:{p}" for p in ports], str(path)
    finally:
        for proc in procs:
            vllm_local.stop_server(proc)


def external_kv_tokens(url: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("vllm:prompt_tokens_by_source_total") and 'source="external_kv_transfer"' in line:
            return float(line.split()[-1])
    raise AssertionError("no prompt_tokens_by_source metric")


async def test_multi_turn_prefill_decode_split_and_role_switch(two_kv_engines, redis, keys):
    urls, tokenizer = two_kv_engines
    reg = Registry(redis, keys)
    for i, url in enumerate(urls):
        await reg.add_engine(EngineInfo(id=f"e{i}", url=url, model="tiny", tokenizer=tokenizer))

    async def episode(tid: str):
        fleet = Fleet(registry=reg, refresh_s=0)
        params = RolloutRequest(tasks=[{}], env="calc", max_turns=3, sampling={"temperature": 0.0, "max_tokens": 8})
        traj = await run_episode(Work(tid, "pd", 0, 0, {"seed": 11}, params), fleet, LocalEnvs())
        await fleet.aclose()
        assert traj.failure is None, traj.failure
        return traj

    await reg.set_role("e1", "mixed")
    colocated = await episode("colocated")
    assert {t.engine_id for t in colocated.turns} == {"e0"} or {t.engine_id for t in colocated.turns} == {"e1"}

    await reg.set_role("e0", "prefill")
    await reg.set_role("e1", "decode")
    before = external_kv_tokens(urls[1])
    split = await episode("split")
    assert len(split.turns) == 3 and all(t.engine_id == "e1" for t in split.turns)
    assert external_kv_tokens(urls[1]) - before >= sum(len(t.prompt_ids) for t in split.turns)  # KV arrived
    assert split.token_ids == colocated.token_ids

    await reg.set_role("e0", "decode")
    await reg.set_role("e1", "prefill")
    before = external_kv_tokens(urls[0])
    switched = await episode("switched")
    assert all(t.engine_id == "e0" for t in switched.turns) and external_kv_tokens(urls[0]) > before
    assert switched.token_ids == colocated.token_ids
