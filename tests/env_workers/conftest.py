"""Sandbox fixtures: `make_sandbox(limits)` for each backend, closed after the test.

The docker backend runs for real against podman's Docker API: a podman service on a socket
in a temp folder for the whole session (or `ROLLOUT_TEST_DOCKER_URL`, if set), with the
sandbox image imported once and cached. Missing prerequisites fail loudly, never skip."""

from __future__ import annotations

import os
import signal

import pytest

from env_workers.sandbox import Limits, bwrap
from rollout_service.local import podman

BACKENDS = ["bwrap", "docker"]
APT = "apt-get install -y --no-install-recommends bubblewrap podman runc busybox-static python3.11"


@pytest.fixture(scope="session")
def docker_url(tmp_path_factory):
    """The Docker API URL of the docker backend tests: podman's, or `ROLLOUT_TEST_DOCKER_URL`."""
    url = os.environ.get("ROLLOUT_TEST_DOCKER_URL")
    if url:
        yield url
        return
    if lacking := podman.missing():
        pytest.fail(f"docker backend tests need {', '.join(lacking)}: {APT}")
    service = podman.PodmanService(tmp_path_factory.mktemp("podman")).start()
    try:
        yield service.url
    finally:
        service.stop()


@pytest.fixture(scope="session")
def docker_env(docker_url):
    """(client, image, ids of the containers made) for the docker backend."""
    import docker

    from env_workers.sandbox.docker import LABEL

    client = docker.DockerClient(base_url=docker_url, timeout=60)
    made: list[str] = []
    try:
        yield client, podman.ensure_image(client), made
        for c in client.containers.list(all=True, filters={"label": LABEL}):
            if c.id in made:  # only ours: another run on this machine shares podman's storage
                c.remove(force=True)  # anything a failed test left behind
    finally:
        client.close()
        if not os.environ.get("ROLLOUT_TEST_DOCKER_URL"):
            _end_conmons(made)


def _end_conmons(container_ids: list[str]) -> None:
    """podman leaves one `conmon --exit-delay 300` per exec, idling for five minutes after its
    container is gone; end ours (by pid, matched on our containers' ids) rather than leave them."""
    ids = {i.encode() for i in container_ids}
    for e in os.scandir("/proc"):
        try:
            if not e.name.isdigit():
                continue
            argv = open(f"/proc/{e.name}/cmdline", "rb").read().split(b"\0")
            if argv and argv[0].endswith(b"conmon") and ids & set(argv):
                os.kill(int(e.name), signal.SIGKILL)
        except OSError:
            pass


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture
def make_sandbox(backend, request):
    made = []

    def make(limits: Limits | None = None):
        if backend == "bwrap":
            if why := bwrap.available():
                pytest.fail(f"{why}: {APT}")
            sb = bwrap.BwrapSandbox(limits)
        else:
            from env_workers.sandbox.docker import DockerSandbox

            client, image, ids = request.getfixturevalue("docker_env")
            sb = DockerSandbox(client, image, limits)
            ids.append(sb.container.id)
        made.append(sb)
        return sb

    yield make
    for sb in made:
        sb.close()


@pytest.fixture
def sandbox(make_sandbox):
    return make_sandbox(Limits(timeout_s=5.0))


@pytest.fixture
def probe_envs(monkeypatch):
    """Two envs like `math`, `probe-inline` (`EnvSpec.inline`) and `probe-threaded`, registered for
    one test; each call records whether it ran on an event loop: {name: [True, ...]}."""
    import asyncio

    from env_workers import registry
    from env_workers.envs.math import MathEnv

    seen: dict[str, list[bool]] = {"probe-inline": [], "probe-threaded": []}

    def on_loop() -> bool:
        try:
            asyncio.get_running_loop()
            return True
        except RuntimeError:  # a worker thread has none
            return False

    def probe(name: str):
        class Probe(MathEnv):
            def reset(self, task, seed=None):
                seen[name].append(on_loop())
                return super().reset(task, seed)

            def step(self, action):
                seen[name].append(on_loop())
                return super().step(action)

        return Probe

    registry.names()  # the built-ins first, then the probes beside them
    for name in seen:
        monkeypatch.setitem(registry._REGISTRY, name,
                            registry.EnvSpec(name, probe(name), "probe", inline=name == "probe-inline"))
    return seen
