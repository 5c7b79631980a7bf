"""Which roles an engine can serve, from its KV connector configuration, and where that shows:
the registry (detected by a worker's fleet), the gateway's role route, `rollout engines`."""

from __future__ import annotations

import httpx

from rollout_service.engines.capabilities import ALL, from_kv_config, unknown
from rollout_service.engines.fleet import Fleet
from rollout_service.engines.sim import SimEngine
from rollout_service.engines.sim_server import create_app as create_sim_app
from scheduler.registry import Registry
from tests.conftest import LiveServer
from wire import EngineInfo


def test_kv_roles_map_to_the_roles_an_engine_can_serve():
    assert from_kv_config({"kv_connector": "NixlConnector", "kv_role": "kv_both"}).can_serve == ALL
    assert from_kv_config({"kv_connector": "NixlConnector", "kv_role": "kv_producer"}).can_serve == ("prefill", "mixed")
    assert from_kv_config({"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}).can_serve == ("decode", "mixed")
    assert from_kv_config(None).can_serve == ("mixed",)
    assert not from_kv_config({"kv_connector": "NixlConnector", "kv_role": "kv_producer"}).switchable
    back = from_kv_config({"kv_connector": "NixlConnector", "kv_role": "kv_both",
                           "kv_connector_extra_config": {"bidirectional_kv_xfer": True}})
    assert back.switchable and back.reads_back and "read back" in back.kv


def test_a_kv_role_a_newer_vllm_invents_is_mixed_only_and_said_so():
    caps = from_kv_config({"kv_connector": "NixlConnector", "kv_role": "kv_prefill_and_decode"})
    assert caps.can_serve == ("mixed",) and "not understood" in caps.kv and "kv_prefill_and_decode" in caps.kv
    assert unknown("no /server_info").can_serve is None and not unknown("x").switchable


async def test_a_worker_fleet_asks_each_engine_once_and_records_what_it_can_serve(redis, keys):
    reg = Registry(redis, keys)
    with LiveServer(create_sim_app(SimEngine("sim"))) as sim:
        await reg.add_engine(EngineInfo(id="e0", url=sim.url))
        assert (await reg.engine("e0")).can_serve is None
        fleet = Fleet(registry=reg, refresh_s=0)
        await fleet.probe()
        await fleet.aclose()
    e0 = await reg.engine("e0")
    assert e0.can_serve == list(ALL) and "kv_both" in e0.kv


def test_the_gateway_refuses_a_role_an_engine_cannot_serve(gateway):
    with httpx.Client(base_url=gateway.url) as c:
        assert c.post("/v1/engines", json={"id": "e1", "url": "http://127.0.0.1:9", "can_serve": ["prefill", "mixed"],
                                           "kv": "NixlConnector kv_producer"}).status_code == 201
        r = c.put("/v1/engines/e1/role", json={"role": "decode"})
        assert r.status_code == 409 and r.json()["error"]["code"] == "conflict"
        assert "kv_producer" in r.json()["error"]["message"]
        assert c.put("/v1/engines/e1/role", json={"role": "prefill"}).status_code == 200
        assert c.post("/v1/engines", json={"id": "e2", "url": "http://127.0.0.1:9"}).status_code == 201
        assert c.put("/v1/engines/e2/role", json={"role": "decode"}).status_code == 200  # not detected yet: allowed
        listed = {e["id"]: e for e in c.get("/v1/engines").json()}
        assert listed["e1"]["can_serve"] == ["prefill", "mixed"] and listed["e1"]["role"] == "prefill"
