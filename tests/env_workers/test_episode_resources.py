"""The env worker owns the resource pools: sessions acquire lazily, deletion and expiry
release, infrastructure trouble is a 503 the client raises as `SandboxUnavailable`."""

from __future__ import annotations

import time

import httpx
import pytest

from env_workers import registry
from env_workers.checker import check_env
from env_workers.client import LocalEnvs, RemoteEnvs, SandboxUnavailable
from env_workers.envs import code, swe
from env_workers.resources import Pools, PoolSize
from env_workers.server import create_app
from tests.conftest import LiveServer

BASH = "```bash\necho hi > f && cat f\n```"


@pytest.fixture
def pools():
    p = Pools(PoolSize(warm=0, cap=4, wait_s=0.3))
    yield p
    p.close()


def wait_for(cond, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_session_gets_its_sandbox_on_the_first_tool_call_and_loses_it_on_delete(pools):
    with LiveServer(create_app(pools=pools)) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        sid = c.post("/v1/sessions", json={"env": "swe", "task": {"seed": 1}}).json()["session_id"]
        assert pools.held(sid) == []
        r = c.post(f"/v1/sessions/{sid}/step", json={"action": BASH}).json()
        assert r["observation"][0]["content"] == "hi\n" and r["info"]["tool_failure"] is None
        (res,) = pools.held(sid)
        again = c.post(f"/v1/sessions/{sid}/step", json={"action": "```bash\ncat f\n```"}).json()
        assert again["observation"][0]["content"] == "hi\n" and pools.held(sid) == [res]  # same sandbox
        assert c.delete(f"/v1/sessions/{sid}").status_code == 200
        assert pools.held(sid) == [] and res.state.value == "destroyed"
        assert not res.value.sandbox.workspace.exists()


def test_the_trajectory_owns_the_sandbox_and_a_new_attempt_replaces_the_old_session(pools):
    """`EnvOpen.trajectory_id` is the lease owner: the id everyone else knows. A second session
    for the same trajectory (a restarted attempt) closes the first and starts clean."""
    with LiveServer(create_app(pools=pools)) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        tid = "b0-3-1"
        first = c.post("/v1/sessions", json={"env": "swe", "task": {"seed": 1}, "trajectory_id": tid}).json()
        c.post(f"/v1/sessions/{first['session_id']}/step", json={"action": BASH})
        (old,) = pools.held(tid)
        second = c.post("/v1/sessions", json={"env": "swe", "task": {"seed": 1}, "trajectory_id": tid}).json()
        assert old.state.value == "destroyed" and pools.held(tid) == []
        assert c.post(f"/v1/sessions/{first['session_id']}/step", json={"action": BASH}).status_code == 404
        c.post(f"/v1/sessions/{second['session_id']}/step", json={"action": "```bash\ncat f\n```"})
        (new,) = pools.held(tid)
        assert new is not old and new.owner == tid


def test_an_expired_session_releases_its_sandbox(pools):
    with LiveServer(create_app(pools=pools, idle_s=1.0)) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        sid = c.post("/v1/sessions", json={"env": "swe", "task": {"seed": 1}}).json()["session_id"]
        c.post(f"/v1/sessions/{sid}/step", json={"action": BASH})
        assert len(pools.held(sid)) == 1
        wait_for(lambda: pools.held(sid) == [])


async def test_no_sandbox_in_time_is_a_503_the_client_raises_as_sandbox_unavailable(pools):
    small = Pools(PoolSize(warm=0, cap=1, wait_s=0.2))
    small.acquire("hog", swe.SPEC)
    try:
        with LiveServer(create_app(pools=small)) as srv:
            async def pick(env):
                return srv.url

            envs = RemoteEnvs(pick)
            h, _ = await envs.open("swe", {"seed": 1}, None)
            with pytest.raises(SandboxUnavailable, match="in use"):
                await envs.step(h, BASH)
            r = httpx.post(f"{srv.url}/v1/sessions/{h.session_id}/step", json={"action": BASH})
            assert r.status_code == 503 and r.json()["error"]["code"] == "sandbox_unavailable"
            await envs.close(h)
            await envs.aclose()
    finally:
        small.close()


def test_the_worker_prewarms_the_pools_its_envs_declare():
    with LiveServer(create_app(pool_size=PoolSize(warm=1, cap=4))) as srv:
        def warm():
            stats = httpx.get(f"{srv.url}/healthz").json()["resources"]
            return sorted(v["idle"] for v in stats.values()) == [1, 1]

        wait_for(warm, 15.0)
    assert {code.SPEC, swe.SPEC} <= {s for n in registry.names() for s in registry.spec(n).resources}


async def test_local_envs_release_on_close():
    envs = LocalEnvs()
    h, _ = await envs.open("swe", {"seed": 3}, None)
    env, _ = envs._envs[h.session_id]  # (environment, inline)
    await envs.step(h, BASH)
    claims = env._sandbox.claims
    assert len(claims.held) == 1
    await envs.close(h)
    assert claims.held == []


def test_check_env_default_actions_never_touch_a_sandbox(monkeypatch, pools):
    """The conformance checker's actions are not tool calls: no env gets a sandbox for them."""
    from env_workers.sandbox import pool as sandbox_pool

    monkeypatch.setattr(sandbox_pool, "_default", pools)
    for name in ("code", "swe"):
        check_env(name)
    assert pools.stats() == {}
