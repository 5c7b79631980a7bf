"""Crash consistency: `kill -9` one part of `rollout up` in the middle of a 200-trajectory
batch. The supervisor restarts it, and every trajectory still completes exactly once."""

from __future__ import annotations

import collections
import signal
import time

import psutil
import pytest
import redis

from tests.conftest import REDIS_URL
from tests.e2e.test_up import start_up, stop_up
from trainer_client import RolloutClient

pytestmark = pytest.mark.e2e

# which child to kill, found by its command line
PARTS = {"gateway": "gateway", "worker": " worker", "env-worker": "env-worker", "engine": "sim-engine"}


def kill9(up_pid: int, part: str) -> int:
    for child in psutil.Process(up_pid).children(recursive=True):
        cmd = " ".join(child.cmdline())
        if "rollout_service.cli" in cmd and PARTS[part] in cmd and (part != "worker" or "env-worker" not in cmd):
            child.send_signal(signal.SIGKILL)
            return child.pid
    raise AssertionError(f"no {part} process found")


@pytest.mark.parametrize("part", list(PARTS))
def test_kill9_mid_batch_loses_and_duplicates_nothing(tmp_path, prefix, part):
    env = {"ROLLOUT_REDIS_URL": REDIS_URL, "ROLLOUT_KEY_PREFIX": prefix, "ROLLOUT_LEASE_S": "2",
           "ROLLOUT_MAX_ATTEMPTS": "6"}
    proc, url = start_up(tmp_path, env, "--engine", "sim", "--sim-time-scale", "2")
    try:
        with RolloutClient(url, timeout=10) as c:
            batch = c.submit([{"seed": s} for s in range(50)], env="calc", group_size=4, max_turns=4,
                             sampling={"temperature": 1.0, "max_tokens": 64})
            assert batch.num_trajectories == 200
            while c.status(batch.id).done < 20:  # mid-batch: some done, many running
                time.sleep(0.05)
            killed = kill9(proc.pid, part)
            seen = collections.Counter(ev.trajectory_id for ev in c.events(batch.id))
            assert not psutil.pid_exists(killed) or psutil.Process(killed).status() == psutil.STATUS_ZOMBIE
            st = c.status(batch.id)
            trajs = list(c.trajectories(batch.id))
        assert st.state.value == "completed" and st.done == 200
        assert len(seen) == 200 and max(seen.values()) == 1  # every trajectory, each once
        assert len({t.id for t in trajs}) == 200
        bad = [(t.id, t.state.value, t.failure) for t in trajs if t.state.value not in ("completed", "truncated")]
        assert not bad, bad[:3]
        if part in ("worker", "engine", "env-worker"):
            # the kill really hit running work, which was restarted without charging its attempts
            assert any(t.restarts > 0 for t in trajs) and all(t.attempts == 1 for t in trajs)
        # each result holds one attempt's turns, in order, none left over from a killed attempt
        assert all([x.index for x in t.turns] == list(range(len(t.turns))) for t in trajs)
        live = list(redis.Redis.from_url(REDIS_URL).scan_iter(match=f"{prefix}traj:*:turns", count=1000))
        assert not live, live[:3]  # every attempt's live turn list went with its end
    finally:
        stop_up(proc)
