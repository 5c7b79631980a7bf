"""The CLI given input it refuses, or stopped: one line saying what, never a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx


def test_a_tasks_file_the_sdk_refuses_names_each_bad_line_and_sends_nothing(tmp_path):
    """A task holding NaN (which Python's parser reads) or a line that is JSON but not an object
    ended `rollout submit` in a pydantic traceback. Nothing is sent: the URL here answers nothing."""
    f = tmp_path / "math.jsonl"
    f.write_text('{"seed": 1}\n\n{"seed": NaN}\n[1, 2]\n{"seed": 4}\n')
    out = subprocess.run([sys.executable, "-m", "rollout_service.cli", "submit", str(f), "--url", "http://127.0.0.1:9"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.splitlines() == [
        "invalid batch:",
        f"  {f}:3: $.seed is nan: JSON has no NaN or Infinity (send a string or null)",
        f"  {f}:4: Input should be a valid dictionary"]
    out = subprocess.run([sys.executable, "-m", "rollout_service.cli", "submit", str(f), "--group-size", "0",
                          "--url", "http://127.0.0.1:9"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "group_size: Input should be greater than or equal to 1" in out.stderr


def test_bad_paths_and_arguments_are_one_error_line_not_a_traceback(tmp_path):
    """A folder given as the tasks file or recording, or an argument the SDK's request model
    refuses (a negative policy version, an empty tenant), ended in a traceback. Nothing is sent:
    the URL here answers nothing."""
    url = ["--url", "http://127.0.0.1:9"]
    for argv, said in [(["submit", str(tmp_path), *url], f"error: Is a directory: {tmp_path}"),
                       (["replay", str(tmp_path)], f"error: Is a directory: {tmp_path}"),
                       (["weights", "/ckpt", "--version", "-3", *url],
                        "error: invalid WeightUpdate: version: Input should be greater than or equal to 0"),
                       (["keys", "", *url], "error: invalid ApiKeyCreate: tenant: String should have at least 1 character")]:
        out = subprocess.run([sys.executable, "-m", "rollout_service.cli", *argv], capture_output=True, text=True,
                             timeout=60, env={**os.environ, "COLUMNS": "200"})
        assert out.returncode == 1 and "Traceback" not in out.stdout + out.stderr, (argv, out.stderr)
        assert said in out.stdout + out.stderr, (argv, out.stdout, out.stderr)


def test_ctrl_c_while_waiting_leaves_the_batch_running_and_says_how_to_reach_it(gateway, tmp_path):
    """Ctrl-C during `rollout submit --wait` was a KeyboardInterrupt traceback out of httpx. No
    worker runs here: the batch stays queued while the command waits on its events."""
    f = tmp_path / "math.jsonl"
    f.write_text('{"seed": 1}\n')
    proc = subprocess.Popen([sys.executable, "-m", "rollout_service.cli", "submit", str(f), "--wait", "--url",
                             gateway.url], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "COLUMNS": "200"})
    first = proc.stdout.readline()  # "batch ID: 1 trajectories of 'math'", then the progress bar
    bid = first.split()[1].rstrip(":")
    proc.send_signal(signal.SIGINT)
    rest = proc.communicate(timeout=60)[0]
    assert proc.returncode == 130 and "Traceback" not in rest, rest
    assert f"batch {bid} goes on" in rest and f"rollout cancel {bid}" in rest
    assert httpx.get(f"{gateway.url}/v1/batches/{bid}").json()["state"] == "queued"


def test_numbers_out_of_range_are_refused_by_the_parser():
    """`rollout up --port 70000` ended in an OverflowError traceback, `--engines -1` in an
    IndexError, and `--port 0` or `--workers 0` started a service that printed a useless URL or
    never ran a trajectory."""
    for argv, said in [(["up", "--port", "70000"], "argument --port: 70000: a port must be 1 to 65535"),
                       (["up", "--port", "0"], "a port must be 1 to 65535"),
                       (["up", "--engines", "-1"], "argument --engines: -1: engines must be 1 to 64"),
                       (["up", "--workers", "0"], "rollout workers must be 1 to 256"),
                       (["up", "--sim-time-scale", "nan"], "a time scale must be at least 0"),
                       (["worker", "--concurrency", "0"], "trajectories in flight must be 1 to 100000"),
                       (["allocator", "--every-s", "0"], "a time in seconds must be above 0"),
                       (["sim-engine", "--port", "x"], "not a whole number: 'x'")]:
        out = subprocess.run([sys.executable, "-m", "rollout_service.cli", *argv], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 2 and "Traceback" not in out.stderr, (argv, out.stderr)
        assert said in out.stderr, (argv, out.stderr)


def test_the_command_rollout_up_suggests_works_when_pasted_from_elsewhere(gateway, tmp_path, monkeypatch):
    """`rollout up --port 8100` suggested `rollout submit examples/math.jsonl ...`: the CLI's default
    gateway is port 8000 (connection refused), and from any folder but the checkout's root no such
    file. The suggestion now names both as they are; pasted from another folder it submits."""
    from rollout_service.up import try_command

    monkeypatch.delenv("ROLLOUT_URL", raising=False)
    assert try_command("127.0.0.1", 8000).count("--url") == 0  # the CLI's default gateway: nothing to add
    host, port = gateway.url.removeprefix("http://").rsplit(":", 1)
    line = try_command(host, int(port), cwd=tmp_path)
    assert f"--url {gateway.url}" in line and " examples/" not in line, line
    argv = line.split()[1:-1]  # without `--wait`: no worker runs here, the batch stays queued
    out = subprocess.run([sys.executable, "-m", "rollout_service.cli", *argv], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    bid = out.stdout.split()[1].rstrip(":")
    tasks = [x for x in Path(argv[1]).read_text().splitlines() if x.strip()]
    assert httpx.get(f"{gateway.url}/v1/batches/{bid}").json()["num_trajectories"] == 4 * len(tasks)
