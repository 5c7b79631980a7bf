"""Redis failover: `rollout up` on a primary + replica watched by a Sentinel; the primary is
killed (-9) in the middle of a 200-trajectory batch, the Sentinel promotes the replica, and
the batch completes on it with every trajectory exactly once."""

from __future__ import annotations

import subprocess
import time

import psutil
import pytest
import redis

from tests.conftest import free_port
from tests.e2e.test_up import start_up, stop_up
from trainer_client import RolloutClient

pytestmark = pytest.mark.e2e


def server(tmp_path, name: str, port: int, *args: str) -> subprocess.Popen:
    folder = tmp_path / name
    folder.mkdir()
    return subprocess.Popen(["redis-server", *args, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
                             "--save", "", "--appendonly", "no"],
                            stdout=open(folder / "log", "wb"), stderr=subprocess.STDOUT)


def wait(check, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = check()
            if got:
                return got
        except redis.RedisError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def sentinel_pair(tmp_path):
    """(primary process, primary port, replica port, sentinel port); everything stopped after."""
    p1, p2, ps = free_port(), free_port(), free_port()
    procs = [server(tmp_path, "primary", p1), server(tmp_path, "replica", p2, "--replicaof", "127.0.0.1", str(p1))]
    wait(lambda: redis.Redis(port=p2).info("replication")["master_link_status"] == "up", "the replica to sync")
    conf = tmp_path / "sentinel.conf"  # Sentinel rewrites its configuration file: it must be writable
    conf.write_text(f"port {ps}\nbind 127.0.0.1\nsentinel monitor main 127.0.0.1 {p1} 1\n"
                    "sentinel down-after-milliseconds main 1000\nsentinel failover-timeout main 10000\n")
    procs.append(subprocess.Popen(["redis-server", str(conf), "--sentinel"], stdout=open(tmp_path / "sentinel.log", "wb"),
                                  stderr=subprocess.STDOUT))
    sen = redis.Redis(port=ps)
    wait(lambda: sen.sentinel_master("main")["num-slaves"] >= 1, "the Sentinel to find the replica")
    try:
        yield procs[0], p1, p2, ps
    finally:
        for p in procs:
            p.kill()
            p.wait(10)


def test_primary_killed_mid_batch_fails_over_and_loses_nothing(tmp_path, sentinel_pair):
    primary, p1, p2, ps = sentinel_pair
    env = {"ROLLOUT_REDIS_URL": f"redis+sentinel://127.0.0.1:{ps}/main/0", "ROLLOUT_KEY_PREFIX": "fo:",
           "ROLLOUT_LEASE_S": "3"}
    proc, url = start_up(tmp_path, env, "--engine", "sim", "--sim-time-scale", "2")
    try:
        with RolloutClient(url, timeout=10) as c:
            batch = c.submit([{"seed": s} for s in range(50)], env="calc", group_size=4, max_turns=4,
                             sampling={"temperature": 1.0, "max_tokens": 64})
            assert batch.num_trajectories == 200
            while c.status(batch.id).done < 20:  # mid-batch: some done, many running
                time.sleep(0.05)
            done_at_kill = c.status(batch.id).done
            primary.kill()
            primary.wait(10)
            sen = redis.Redis(port=ps)
            wait(lambda: int(sen.sentinel_master("main")["port"]) == p2, "the Sentinel to promote the replica")
            wait(lambda: c.status(batch.id).state.value == "completed", "the batch to complete", timeout=240)
            st = c.status(batch.id)
            trajs = list(c.trajectories(batch.id))
            after = c.submit([{"seed": 99}], env="calc", group_size=2, max_turns=2)  # the service still takes work
            wait(lambda: c.status(after.id).done == 2, "a batch submitted after the failover")
        print("done at kill", done_at_kill, "restarted", sum(t.restarts > 0 for t in trajs))
        assert done_at_kill < 200
        assert st.done == 200 and len(trajs) == 200 and len({t.id for t in trajs}) == 200  # none lost, none twice
        bad = [(t.id, t.state.value, t.failure) for t in trajs if t.state.value not in ("completed", "truncated")]
        assert not bad, bad[:3]
        charged = [t for t in trajs if t.attempts != 1]  # ours: nothing charged; if not, the service's log says why
        why = [ln for ln in (tmp_path / "up.log").read_text(errors="replace").splitlines()
               if any(t.id in ln for t in charged)]
        assert not charged, ([(t.id, t.attempts, t.restarts, t.failure) for t in charged], why[:20])
        assert all([x.index for x in t.turns] == list(range(len(t.turns))) for t in trajs)
        assert redis.Redis(port=p2).info("replication")["role"] == "master"
        assert psutil.Process(proc.pid).is_running()
    finally:
        stop_up(proc)


def test_sentinel_urls_parse_and_bad_ones_say_the_form():
    from scheduler.connection import SentinelURL

    got = SentinelURL.parse("redis+sentinel://:s3cret@10.0.0.1:26379,10.0.0.2/main/2")
    assert got == SentinelURL((("10.0.0.1", 26379), ("10.0.0.2", 26379)), "main", 2, "s3cret")
    assert SentinelURL.parse("redis://127.0.0.1:6379/0") is None
    with pytest.raises(ValueError, match="redis\\+sentinel://host:port"):
        SentinelURL.parse("redis+sentinel://127.0.0.1:26379")


def test_a_durable_write_is_on_the_replica_when_it_returns(sentinel_pair, caplog):
    import asyncio

    from scheduler.connection import connect, durable

    _, _, p2, ps = sentinel_pair

    async def go():
        r = connect(f"redis+sentinel://127.0.0.1:{ps}/main/0")
        script = r.register_script("redis.call('SET', ARGV[1], ARGV[2]); return 7")
        got = await durable(r, script, ["fo:durable", "yes"], replicas=1)
        await durable(r, script, ["fo:durable2", "yes"], replicas=2, timeout_ms=200)  # only one replica exists
        await r.aclose()
        return got

    assert asyncio.run(go()) == 7
    # WAIT returned only once the replica had it: read it there, without waiting
    assert redis.Redis(port=p2).get("fo:durable") == b"yes"
    # WAIT's own count comes back: one replica of the two asked for, logged, not raised
    assert "write reached 1 of 2 replicas" in caplog.text
