"""The chaos soak, two minutes of it, on the defaults of `rollout up` (embedded Redis, 30 s
lease, 3 attempts): continuous batches while every component is `kill -9`ed in turn, some
two at once. Nothing may be lost or duplicated, and the service must be healthy after."""

from __future__ import annotations

import pytest

from benchmarks.chaos import COMPONENTS, restarts_by_kind, soak

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(900)
def test_chaos_soak_loses_nothing_and_heals(tmp_path):
    rep = soak(minutes=1.75, seed=7, workdir=tmp_path, say=lambda _: None)
    assert all(rep.kills[c] >= 1 for c in COMPONENTS), rep.kills  # every part was killed at least once
    assert rep.trajectories >= 32 * 3, rep  # work ran all along (3 batches open at a time)
    assert rep.lost == 0 and rep.duplicated == 0, rep
    assert rep.ok_share >= 0.995, rep.failed  # our faults never cost a trajectory: sim + calc never fail alone
    assert rep.restarted_trajectories > 0 and rep.metrics_trajectory_restarts >= rep.restarted_trajectories
    # the service is healthy afterwards: a fresh batch completes (the 10 s figure lives in benchmarks/chaos.py)
    assert rep.fresh_batch_s > 0
    got = restarts_by_kind(rep)
    assert all(got.get(c, 0) >= rep.kills[c] for c in COMPONENTS), (got, rep.kills)  # /metrics counts restarts
