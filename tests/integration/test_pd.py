"""Prefill/decode disaggregation for real: two vLLM CPU engines with NixlConnector, a
multi-turn episode routed prefill -> decode through the service, the KV received by the
decode engine, tokens equal to a colocated run at temperature 0; the last response's KV read
back from the decode engine (not recomputed); then the roles switch."""

from __future__ import annotations

import time

import httpx
import pytest

from env_workers.client import LocalEnvs
from rollout_service.engines.fleet import Fleet
from rollout_service.rollout import run_episode
from scheduler.registry import Registry
from scheduler.store import Work
from wire import EngineInfo, RolloutRequest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]  # a loaded 2-core machine is slow


def prompt_tokens(url: str, source: str) -> float:
    """vLLM's count of prompt tokens by where their KV came from: `local_compute` (prefilled
    here), `local_cache_hit`, `external_kv_transfer`."""
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("vllm:prompt_tokens_by_source_total") and f'source="{source}"' in line:
            return float(line.split()[-1])
    raise AssertionError("no prompt_tokens_by_source metric")


def reset_prefix_cache(url: str) -> None:
    """Forget every cached prefix. vLLM refuses while any block is held, and a prefill engine
    holds a turn's blocks until the decode engine's read of them is acknowledged, which can come
    after the turn returns; so the reset is asked again until it succeeds (each try is a
    condition, not a margin: 240 refusals in a row fail the test, whatever the machine's speed)."""
    for _ in range(240):
        r = httpx.post(f"{url}/reset_prefix_cache", timeout=60)
        assert r.status_code == 200, r.text
        if r.json()["success"]:
            return
        time.sleep(0.5)
    raise AssertionError(f"{url} refused to reset its prefix cache 240 times: {r.text}")


async def test_multi_turn_prefill_decode_split_and_role_switch(two_kv_engines, redis, keys):
    urls, tokenizer = two_kv_engines.urls, two_kv_engines.tokenizer
    reg = Registry(redis, keys)
    for i, url in enumerate(urls):
        await reg.add_engine(EngineInfo(id=f"e{i}", url=url, model="tiny", tokenizer=tokenizer))

    async def episode(tid: str, read_back: bool = True):
        fleet = Fleet(registry=reg, refresh_s=0, read_back=read_back)
        params = RolloutRequest(tasks=[{}], env="calc", max_turns=4, sampling={"temperature": 0.0, "max_tokens": 12})
        traj = await run_episode(Work(tid, "pd", 0, 0, {"seed": 11}, params), fleet, LocalEnvs())
        await fleet.aclose()
        assert traj.failure is None, traj.failure
        return traj

    colocated = await episode("colocated")
    assert len({t.engine_id for t in colocated.turns}) == 1

    await reg.set_role("e0", "prefill")
    await reg.set_role("e1", "decode")
    computed = {}
    for read_back in (False, True):  # before / after: the last response recomputed, or read back
        reset_prefix_cache(urls[0])  # the prefill engine starts cold: every prefilled token counts
        before = prompt_tokens(urls[0], "local_compute"), prompt_tokens(urls[1], "external_kv_transfer")
        split = await episode(f"split-{read_back}", read_back)
        assert len(split.turns) == 4 and all(t.engine_id == "e1" for t in split.turns)
        assert prompt_tokens(urls[1], "external_kv_transfer") > before[1]  # the KV went to the decode engine
        assert split.token_ids == colocated.token_ids
        computed[read_back] = prompt_tokens(urls[0], "local_compute") - before[0]
    new = sum(len(t.prompt_ids) for t in colocated.turns)  # each turn's prompt delta: what is new
    earlier = sum(len(t.output_ids) for t in colocated.turns[:-1])  # responses a later turn carries
    turns = len(colocated.turns)
    per_turn = {k: round(v / turns, 1) for k, v in computed.items()}
    print(f"prefill tokens computed per split turn: recompute {per_turn[False]}, read back {per_turn[True]} "
          f"(new tokens per turn {new / turns:.1f})")
    # before: every later turn recomputed the response before it (less its last token, which
    # was never computed anywhere); after: only what is new, plus that one token per turn
    assert computed[False] >= new + earlier - turns
    assert computed[True] <= new + turns
    assert computed[True] < computed[False]

    await reg.set_role("e0", "decode")
    await reg.set_role("e1", "prefill")
    before = prompt_tokens(urls[0], "external_kv_transfer")
    switched = await episode("switched")
    assert all(t.engine_id == "e0" for t in switched.turns) and prompt_tokens(urls[0], "external_kv_transfer") > before
    assert switched.token_ids == colocated.token_ids
