"""`rollout up` as a user runs it: real processes, real HTTP, then a clean stop."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from tests.conftest import REDIS_URL, free_port
from trainer_client import RolloutClient

pytestmark = pytest.mark.e2e


def start_up(tmp_path, extra_env: dict[str, str], *args: str, ignore_sigint: bool = False) -> tuple[subprocess.Popen, str]:
    """`ignore_sigint`: start it as a shell starts a background job (`rollout up &`): SIGINT ignored."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUT_")}
    env.update({"ROLLOUT_CACHE_DIR": str(tmp_path / "cache"), **extra_env})
    proc = subprocess.Popen([sys.executable, "-m", "rollout_service.cli", "up", "--port", str(port), *args],
                            env=env, stdout=open(tmp_path / "up.log", "wb"), stderr=subprocess.STDOUT,
                            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        assert proc.poll() is None, (tmp_path / "up.log").read_text()
        assert time.monotonic() < deadline, "rollout up did not become ready"
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200 and \
                    httpx.get(f"{url}/v1/workers", timeout=1).json():
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)


def stop_up(proc: subprocess.Popen) -> None:
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)
    gone, alive = psutil.wait_procs(children, timeout=15)
    assert not alive, f"left running: {[p.cmdline() for p in alive]}"


def test_up_with_embedded_redis_answers_a_multi_turn_batch(tmp_path):
    proc, url = start_up(tmp_path, {}, "--engine", "sim", "--sim-time-scale", "0.1")
    try:
        with RolloutClient(url) as c:
            batch = c.submit([{"seed": s} for s in range(3)], env="calc", group_size=4,
                             sampling={"temperature": 1.0, "max_tokens": 128})
            trajs = list(c.iter_results(batch.id))
            assert len(trajs) == 12
            assert all(t.state.value in ("completed", "truncated") for t in trajs)
            assert any(len(t.turns) >= 2 for t in trajs)
            for t in trajs:
                assert len(t.token_ids) == len(t.loss_mask) == len(t.logprobs)
                assert all(turn.engine_id == "engine-0" for turn in t.turns)
            data = tmp_path / "cache" / "redis" / f"port-{url.rsplit(':', 1)[1]}"
            assert (data / "appendonlydir").exists() or (data / "appendonly.aof").exists()
    finally:
        stop_up(proc)


def test_up_with_external_redis_and_cli_submit(tmp_path, prefix):
    proc, url = start_up(tmp_path, {"ROLLOUT_REDIS_URL": REDIS_URL, "ROLLOUT_KEY_PREFIX": prefix},
                         "--engine", "sim", "--sim-time-scale", "0")
    try:
        out = subprocess.run([sys.executable, "-m", "rollout_service.cli", "submit", "examples/math.jsonl",
                              "--group-size", "4", "--wait", "--url", url], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert "completed" in out.stdout and "mean reward" in out.stdout and "32/32" in out.stdout
    finally:
        stop_up(proc)


def test_ctrl_c_stops_every_part_in_order_with_no_error_in_any_log(tmp_path, prefix):
    """SIGINT (even when started in the background, where shells ignore it) stops the gateway
    first, then hands running work back, then Redis last: no error line anywhere."""
    proc, url = start_up(tmp_path, {"ROLLOUT_REDIS_URL": REDIS_URL, "ROLLOUT_KEY_PREFIX": prefix},
                         "--engine", "sim", "--sim-time-scale", "200",  # slow turns: work is in flight
                         ignore_sigint=True)
    children = psutil.Process(proc.pid).children(recursive=True)
    with RolloutClient(url) as c:
        batch = c.submit([{"seed": s} for s in range(4)], env="calc", group_size=2, max_turns=4)
        while c.status(batch.id).counts.get("running", 0) == 0:
            time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(120) == 0
    assert not psutil.wait_procs(children, timeout=15)[1]
    logs = list((tmp_path / "cache" / "logs").rglob("*.log"))
    assert logs
    for log in logs:
        text = log.read_text(errors="replace")
        bad = [line for line in text.splitlines() if "Traceback" in line or '"level": "ERROR"' in line
               or line.startswith("ERROR")]
        assert not bad, (log.name, bad[:5])
    import redis as syncredis

    from scheduler.keys import Keys

    r, keys = syncredis.Redis.from_url(REDIS_URL), Keys(prefix)
    states = [r.hget(keys.traj(t.decode()), "state") for t in r.lrange(keys.batch_trajs(batch.id), 0, -1)]
    assert b"running" not in states  # handed back (queued) or finished, never left holding a lease
    assert r.zcard(keys.leases) == 0


def test_an_unreachable_redis_is_one_line_before_anything_starts(tmp_path):
    """`--redis-url` naming a Redis that does not answer ended in a redis-py traceback, after the
    engines had started. Now it is one line with the reason, the password masked, and exit 1."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUT_")}
    env["ROLLOUT_CACHE_DIR"] = str(tmp_path / "cache")
    out = subprocess.run([sys.executable, "-m", "rollout_service.cli", "up", "--engine", "sim", "--port",
                          str(free_port()), "--redis-url", f"redis://:s3cret@127.0.0.1:{free_port()}/0"],
                         env=env, capture_output=True, text=True, timeout=120)
    said = out.stdout + out.stderr
    assert out.returncode == 1 and "Traceback" not in said, said
    assert "Redis at redis://***@127.0.0.1:" in said and "Connection refused" in said and "s3cret" not in said
    assert "engine 0" not in said  # nothing was started


def test_up_with_a_vllm_engine_not_prepared_says_how_to_prepare_it(tmp_path):
    """`--engine vllm` on a machine where `rollout engine prepare` never ran started Redis, then
    ended in a FileNotFoundError traceback for the missing venv's python."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUT_")}
    env["ROLLOUT_CACHE_DIR"] = str(tmp_path / "cache")
    out = subprocess.run([sys.executable, "-m", "rollout_service.cli", "up", "--engine", "vllm", "--port",
                          str(free_port())], env=env, capture_output=True, text=True, timeout=120)
    said = out.stdout + out.stderr
    assert out.returncode == 1 and "Traceback" not in said, said
    assert "run `rollout engine prepare smollm2` first" in said and "redis" not in said.lower(), said


def test_a_part_alive_but_not_answering_is_restarted(tmp_path):
    """vLLM's server whose engine core died stays alive, not listening, waiting for requests that
    never end: `rollout up` restarted only parts that exited, so every later turn failed for good.
    A part whose health URL stops answering (here: the engine, frozen with SIGSTOP, which ignores
    the SIGTERM that comes first) is now killed and restarted; a batch then runs."""
    proc, url = start_up(tmp_path, {}, "--engine", "sim", "--sim-time-scale", "0", "--hung-s", "3")
    try:
        def engines() -> list[psutil.Process]:
            found = []
            for p in psutil.Process(proc.pid).children(recursive=True):
                try:  # (the killed one is a zombie until `rollout up` reaps it, or gone)
                    if "sim-engine" in p.cmdline() and p.status() != psutil.STATUS_ZOMBIE:
                        found.append(p)
                except psutil.Error:
                    continue
            return found

        frozen = engines()[0]
        frozen.suspend()
        deadline = time.monotonic() + 60
        while not [p for p in engines() if p.pid != frozen.pid]:
            assert time.monotonic() < deadline, (tmp_path / "up.log").read_text()
            time.sleep(0.5)
        with contextlib.suppress(psutil.Error):
            assert not frozen.is_running() or frozen.status() == psutil.STATUS_ZOMBIE
        log = (tmp_path / "up.log").read_text()
        assert "engine 0 (simulated) has not answered" in log and "restart #1" in log, log
        with RolloutClient(url) as c:
            batch = c.submit([{"seed": s} for s in range(4)], env="math")
            assert {t.state.value for t in c.iter_results(batch.id)} <= {"completed", "truncated"}
    finally:
        stop_up(proc)


def test_an_engine_killed_after_a_weight_push_comes_back_with_the_pushed_weights(tmp_path):
    """`kill -9` of the engine after `update_weights`: `rollout up` restarts it with its launch
    weights, and its turns carried the pushed version anyway, for good. Now the gateway sees the
    restart and loads the pushed weights into it again: the same seeded batch samples the same
    tokens after the restart as before it, under the same version. (The simulated engine is back
    within a second, before a worker's probe could find it down: until the gateway's reload, or a
    worker's periodic check, turns may run on it. A vLLM server loads its model for longer than a
    probe's period, and no turn runs on it until the reload: `test_fleet`.)"""
    proc, url = start_up(tmp_path, {}, "--engine", "sim", "--sim-time-scale", "0")
    try:
        def sampled(c: RolloutClient) -> dict:
            batch = c.submit([{"seed": s} for s in range(4)], env="math", sampling={"seed": 11, "max_tokens": 64})
            trajs = list(c.iter_results(batch.id))
            assert all(t.failure is None for t in trajs), [t.failure for t in trajs]
            return {t.group_index: ([x.output_ids for x in t.turns], {x.policy_version for x in t.turns})
                    for t in trajs}

        with RolloutClient(url) as c:
            launched = sampled(c)
            c.update_weights(path="/ckpt/step-1")
            pushed = sampled(c)
            assert pushed != launched and all(v == {1} for _, v in pushed.values())
            loaded_at = c.engines()[0]["weights"]["engine_started_at"]
            engine = [p for p in psutil.Process(proc.pid).children(recursive=True) if "sim-engine" in p.cmdline()][0]
            engine.kill()
            deadline = time.monotonic() + 60
            while (c.engines()[0]["weights"] or {}).get("engine_started_at") == loaded_at:
                assert time.monotonic() < deadline, (tmp_path / "up.log").read_text()
                time.sleep(0.2)
            assert "restart #1" in (tmp_path / "up.log").read_text()
            assert c.engines()[0]["policy_version"] == 1
            assert sampled(c) == pushed
    finally:
        stop_up(proc)
    gateway_log = (tmp_path / "cache" / "logs").rglob("gateway.log")
    assert any("loading them again" in f.read_text() for f in gateway_log)
