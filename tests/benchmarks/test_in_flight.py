"""The scale benchmark (`benchmarks/load.py --in-flight`) in CI size: a gateway and two worker
processes on a private Redis, a few hundred trajectories in flight, every figure reported.
It asserts what the run must get right (every trajectory once, no API error, no restart), never
a time: the figures themselves are the benchmark's."""

from __future__ import annotations

import argparse

from benchmarks import in_flight
from benchmarks.redis_private import PrivateRedis


def test_a_small_in_flight_run_finishes_everything_and_reports_every_figure(capsys):
    a = argparse.Namespace(in_flight=400, worker_procs=2, turn_s=0.5, pollers=2, poll_every_s=0.05, worker_nice=0)
    with PrivateRedis() as redis_url:
        res = in_flight.in_flight(a, redis_url)
    assert res["completed"] == 400 and res["errors"] == 0, res["error_samples"]
    assert 0 < res["peak_in_flight"] <= 400 and res["api_calls"] > 0
    lost = ("restarting", "reaped", "lease lost", "claimed again")  # (a loop running late is only a warning)
    assert not any(x in w for w in res["worker_warnings"] for x in lost), res["worker_warnings"]
    assert res["status_p99_ms_all"] is not None and res["trajectory_p99_ms_all"] is not None
    assert set(res["cpu_ms_per_trajectory"]) == {"gateway", "workers", "redis"}
    assert res["redis_peak_mb"] > 0
    in_flight.report(res)
    out = capsys.readouterr().out
    assert "completed: 400 of 400" in out and "Redis memory per trajectory in flight" in out
