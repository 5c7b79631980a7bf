"""The operators' path, run for real: build our image with no network from a wheelhouse,
`docker compose up --wait --scale env-worker=3 --scale worker=2`, a multi-turn batch through
the published gateway, `kill -9` of a worker and an env worker mid-batch, `down` / `up`, and
`down -v`.

Compose drives podman's Docker API here (no Docker engine, no registry on our machines);
tests/deploy/podman.py holds every workaround for that, so deploy/ stays as operators use it.
The tests run in file order on one stack. Timings are printed and written to
test-output/deploy-compose.json (deploy/README.md quotes them); none is asserted beyond a
generous bound.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port
from tests.deploy.podman import (OVERRIDE, ROOT, Compose, HealthRunner, Outside, Podman, WalledNetwork, missing_tools,
                                 sh, standin_images, wheelhouse)
from trainer_client import RolloutClient

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

IMAGE = "localhost/rollout-service:e2e"  # kept between runs: its layers are the build cache
SCALE = ["--scale", "env-worker=3", "--scale", "worker=2"]
FIGURES: dict[str, float | dict] = {}


def figure(name: str, value, unit: str = "") -> None:
    FIGURES[name] = value
    print(f"deploy-compose {name}: {value}{(' ' + unit) if unit else ''}")


def build_context(dest: Path, wheels: Path) -> Path:
    """The repository as git sees it (tracked and untracked, not ignored) plus the wheelhouse
    in deploy/wheelhouse: the build context an operator's checkout would be."""
    files = sh("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=ROOT).split("\0")
    for f in filter(None, files):
        src = ROOT / f
        if src.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)
    for whl in wheels.iterdir():
        if whl.name != ".complete":
            try:
                os.link(whl, dest / "deploy/wheelhouse" / whl.name)
            except OSError:
                shutil.copy2(whl, dest / "deploy/wheelhouse" / whl.name)
    return dest


def up(compose: Compose) -> float:
    t = time.monotonic()
    compose("up", "-d", "--wait", "--wait-timeout", "300", "--no-build", "--pull", "never", *SCALE, timeout=420)
    return time.monotonic() - t


def build_image(podman: Podman, python_image: str) -> None:
    """Our image, from the Dockerfile's air-gapped path: no network, no index, the wheelhouse."""
    ctx = build_context(podman.workdir / "context", wheelhouse())
    t = time.monotonic()
    sh("podman", "build", "--format", "docker", "--network", "none", "--pull=never", "-f", "deploy/Dockerfile",
       "--build-arg", f"PYTHON_IMAGE={python_image}", "--build-arg", "INDEX_URL=",
       "--build-arg", "TOKENIZER_PACKAGES=", "-t", IMAGE, ".", cwd=ctx, env=podman.env, timeout=900)
    figure("build_s", round(time.monotonic() - t, 1), "s (podman build --network none, layer cache kept)")
    size = json.loads(sh("podman", "image", "inspect", IMAGE, env=podman.env))[0]["Size"]
    figure("image_mb", round(size / 2**20), "MiB")
    shutil.rmtree(ctx)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    missing = missing_tools()
    if missing:
        pytest.fail(f"the deploy test needs {', '.join(missing)}: .ci/run installs them", pytrace=False)
    podman = Podman(tmp_path_factory.mktemp("compose")).start()
    project = f"rs-e2e-{uuid.uuid4().hex[:6]}"
    image = f"localhost/rollout-service:{project}"  # this run's own name: another run may rebuild IMAGE
    try:
        t = time.monotonic()
        wheelhouse()
        bases = standin_images(podman.env)
        figure("inputs_s", round(time.monotonic() - t, 1), "s (wheelhouse + stand-in base images; cached after the first run)")
        build_image(podman, bases["python"])
        sh("podman", "tag", IMAGE, image, env=podman.env)

        port = free_port()
        override = podman.workdir / "override.yml"
        override.write_text(OVERRIDE)
        compose = Compose(podman, project, {
            "ROLLOUT_IMAGE": image, "REDIS_IMAGE": bases["redis"], "GATEWAY_PORT": f"127.0.0.1:{port}",
            "PUBLISHED_NETWORK": f"{project}-published", "SIM_TIME_SCALE": "1.0"}, override,
            url=f"http://127.0.0.1:{port}")
        with WalledNetwork(podman, f"{project}-published"), HealthRunner(compose):
            try:
                figure("up_healthy_s", round(up(compose), 1), "s (up --wait, --scale env-worker=3 --scale worker=2)")
                yield compose
            finally:
                compose("down", "-v", "--timeout", "5", timeout=180)
    finally:
        subprocess.run(["podman", "rmi", image], env=podman.env, capture_output=True)  # the name only: IMAGE stays
        podman.stop()
        out = ROOT / "test-output"
        out.mkdir(exist_ok=True)
        (out / "deploy-compose.json").write_text(json.dumps(FIGURES, indent=2) + "\n")


def _probe(outside: Outside) -> str:
    return (f"import socket\ntry:\n socket.create_connection(('{outside.ip}', {outside.port}), timeout=5)\n"
            " print('out')\nexcept OSError as e:\n print('blocked', e)")


def no_route_out(podman: Podman, container_id: str, outside: Outside) -> bool:
    """True when the container cannot open a TCP connection to a host off its bridges."""
    r = subprocess.run(["podman", "exec", container_id, "python", "-c", _probe(outside)], env=podman.env,
                       capture_output=True, text=True, timeout=60)
    return r.stdout.startswith("blocked")


def reaches_from_open_bridge(podman: Podman, outside: Outside, net: str) -> bool:
    """The control: our image on a bridge with no wall does reach the outside host (so a
    "blocked" above is the wall's doing, not a host nothing could reach)."""
    sh("podman", "network", "create", net, env=podman.env)
    try:
        r = subprocess.run(["podman", "run", "--rm", "--network", net, "--entrypoint", "python", IMAGE, "-c",
                            _probe(outside)], env=podman.env, capture_output=True, text=True, timeout=120)
        return r.stdout.startswith("out")
    finally:
        subprocess.run(["podman", "network", "rm", "-f", net], env=podman.env, capture_output=True)


def submit(c: RolloutClient, n_tasks: int):
    return c.submit([{"seed": s} for s in range(n_tasks)], env="calc", group_size=4, max_turns=4,
                    sampling={"temperature": 1.0, "max_tokens": 64})


def test_every_service_is_healthy_on_an_internal_network(stack):
    replicas = {s: stack.of(s) for s in ("redis", "gateway", "worker", "env-worker", "sim-engine")}
    assert [len(replicas[s]) for s in ("worker", "env-worker")] == [2, 3]
    for service, cs in replicas.items():
        for c in cs:
            assert c["State"]["Running"], f"{service}: {c['State']}"
            if service != "worker":  # the worker serves no HTTP: no check
                assert c["State"]["Health"]["Status"] == "healthy", f"{service}: {c['State']['Health']}"
    [register] = stack.of("register-sim-engine")
    assert not register["State"]["Running"] and register["State"]["ExitCode"] == 0

    # Only the gateway leaves the internal network, and only to 127.0.0.1.
    with stack.podman.api() as api:
        nets = {n["Name"]: n for n in api.get("/networks").json() if n["Name"].startswith(stack.project)}
    assert nets[f"{stack.project}_default"]["Internal"]
    for service, cs in replicas.items():
        for c in cs:
            for name in c["NetworkSettings"]["Networks"]:
                assert nets[name]["Internal"] or service == "gateway", f"{service} is on {name}"
            bindings = [b for bs in (c["HostConfig"].get("PortBindings") or {}).values() for b in bs or []]
            assert all(b["HostIp"] == "127.0.0.1" for b in bindings), f"{service} publishes {bindings}"
    [gw] = replicas["gateway"]
    assert gw["HostConfig"]["PortBindings"], "the gateway is not published"
    # Nothing gets out: the gateway (the one container on a second network) nor an internal one,
    # to a host the machine itself reaches (checked by `Outside` as it starts).
    with Outside(f"ro{stack.project[-6:]}") as outside:
        assert no_route_out(stack.podman, gw["Id"], outside), "the gateway reaches the outside"
        assert no_route_out(stack.podman, replicas["worker"][0]["Id"], outside), "a worker reaches the outside"
        assert reaches_from_open_bridge(stack.podman, outside, f"{stack.project}-open"), "nothing reaches it unwalled"

    # Through the published port: the engine is registered, the 3 env workers registered themselves.
    with RolloutClient(stack.url) as c:
        assert [e["id"] for e in c.engines()] == ["sim-0"]
    workers = httpx.get(f"{stack.url}/v1/workers", timeout=10).json()
    assert len(workers) == 3, workers

    mem = {}
    for service, cs in replicas.items():
        mem[service] = round(max(stack.memory(c["Id"]) for c in cs) / 2**20)
    figure("memory_mb", mem, "MiB per container (largest replica, idle)")


def test_a_multi_turn_batch_completes_through_the_published_gateway(stack):
    t = time.monotonic()
    with RolloutClient(stack.url) as c:
        batch = submit(c, 16)
        st = c.wait(batch.id, timeout=300)
        trajs = list(c.trajectories(batch.id))
    figure("batch64_s", round(time.monotonic() - t, 1), "s (16 calc tasks x 4, up to 4 turns)")
    assert st.state.value == "completed" and st.done == 64
    assert all(t.state.value in ("completed", "truncated") for t in trajs)
    assert any(len(t.turns) >= 2 for t in trajs), "no trajectory took a second turn"
    stack.batches.append((batch.id, 64))


def pid_of(stack, container: dict) -> int:
    return stack.inspect(container["Id"])["State"]["Pid"]


def back(stack, container: dict, restarts_before: int, deadline: float) -> float:
    """Wait until the container runs again (the same container, restarted by its policy), and
    is healthy if it has a check; returns when."""
    while time.monotonic() < deadline:
        c = stack.inspect(container["Id"])
        health = (c["State"].get("Health") or {}).get("Status")
        if c["RestartCount"] > restarts_before and c["State"]["Running"] and health in (None, "", "healthy"):
            return time.monotonic()
        time.sleep(0.2)
    raise AssertionError(f"{container['Name']} did not come back: {stack.inspect(container['Id'])['State']}")


def test_kill9_of_a_worker_and_an_env_worker_mid_batch_loses_nothing(stack):
    worker, env_worker = stack.of("worker")[0], stack.of("env-worker")[0]
    with RolloutClient(stack.url, timeout=30) as c:
        batch = submit(c, 48)
        total = batch.num_trajectories
        assert total == 192
        while c.status(batch.id).done < total // 10:  # mid-batch: some done, many running
            time.sleep(0.1)
        killed_at = time.monotonic()
        for ctr in (worker, env_worker):  # the container's main process, from the host: its restart policy applies
            os.kill(pid_of(stack, ctr), signal.SIGKILL)
        deadline = killed_at + 120
        figure("restart_worker_s", round(back(stack, worker, worker["RestartCount"], deadline) - killed_at, 1), "s")
        figure("restart_env_worker_s",
               round(back(stack, env_worker, env_worker["RestartCount"], deadline) - killed_at, 1), "s (to healthy)")

        seen = collections.Counter(ev.trajectory_id for ev in c.events(batch.id))
        figure("batch_after_kill_s", round(time.monotonic() - killed_at, 1),
               "s from the kills to the batch's end")
        st = c.status(batch.id)
        trajs = list(c.trajectories(batch.id))
    assert st.state.value == "completed" and st.done == total
    assert len(seen) == total and max(seen.values()) == 1, "a trajectory was lost or reported twice"
    assert len({t.id for t in trajs}) == total
    bad = [(t.id, t.state.value, t.failure) for t in trajs if t.state.value not in ("completed", "truncated")]
    assert not bad, bad[:3]
    assert any(t.restarts > 0 for t in trajs), "the kills hit no running trajectory"
    assert all(t.attempts == 1 for t in trajs), "a lost episode was charged to its trajectory"
    stack.batches.append((batch.id, total))


def test_batches_survive_down_and_up(stack):
    if not stack.batches:
        with RolloutClient(stack.url) as c:
            b = submit(c, 2)
            c.wait(b.id, timeout=300)
            stack.batches.append((b.id, 8))
    stack("down", "--timeout", "10", timeout=180)
    assert not stack.containers() and stack.volumes(), "down removes the containers, keeps the volume"
    figure("up_again_s", round(up(stack), 1), "s (up --wait after down: Redis reloads its append-only file)")
    with RolloutClient(stack.url) as c:
        for batch_id, n in stack.batches:
            st = c.status(batch_id)
            assert st.state.value == "completed" and st.done == n
            assert len(list(c.trajectories(batch_id))) == n


def test_down_v_leaves_no_container_or_volume(stack):
    stack("down", "-v", "--timeout", "10", timeout=180)
    assert stack.containers() == []
    assert stack.volumes() == []
    with stack.podman.api() as api:
        assert not [n for n in api.get("/networks").json() if n["Name"].startswith(stack.project + "_")]
