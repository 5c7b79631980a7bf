"""The sandbox backend is the env worker's configuration (`rollout env-worker --sandbox`, or
`ROLLOUT_SANDBOX_BACKEND`), never the environment's: the same spec, naming no backend, gets
a bubblewrap sandbox or a container depending on how the worker was started."""

from __future__ import annotations

import pytest

from env_workers.envs.swe import SPEC as SANDBOX
from env_workers.envs.swe import SweEnv, generate
from env_workers.resources import Pools, PoolSize
from env_workers.sandbox import backends
from env_workers.sandbox.bwrap import BwrapSandbox
from env_workers.sandbox.docker import DockerSandbox
from env_workers.sandbox.pool import SandboxSpec
from rollout_service.cli import build_parser
from rollout_service.cli.processes import configure_sandboxes


@pytest.fixture(autouse=True)
def _restore_default():
    yield
    backends.configure("bwrap")  # what every other test expects


def _env_worker(*flags: str):
    return build_parser().parse_args(["env-worker", *flags])


def _made_by(spec: SandboxSpec):
    box = spec.create()
    try:
        out = box.tools.call("bash", command="echo from-$((6*7))")
        return type(box.sandbox), out.text
    finally:
        box.tools.close()
        box.sandbox.close()


def test_the_swe_env_names_no_backend():
    assert SANDBOX.backend is None


def test_the_flag_picks_docker_for_a_spec_naming_none(docker_env, docker_url, monkeypatch):
    _, image, made = docker_env
    monkeypatch.setenv("ROLLOUT_SANDBOX_BACKEND", "bwrap")  # the flag wins over the environment
    s = configure_sandboxes(_env_worker("--sandbox", "docker", "--sandbox-image", image,
                                        "--sandbox-docker-url", docker_url))
    assert s.sandbox_backend == "docker"
    box = SANDBOX.create()
    try:
        made.append(box.sandbox.container.id)
        assert isinstance(box.sandbox, DockerSandbox)
        assert "from-42" in box.tools.call("bash", command="echo from-$((6*7))").text
    finally:
        box.tools.close()
        box.sandbox.close()


def test_without_the_flag_the_setting_decides(monkeypatch):
    monkeypatch.setenv("ROLLOUT_SANDBOX_BACKEND", "docker")
    monkeypatch.delenv("ROLLOUT_SANDBOX_IMAGE", raising=False)
    assert configure_sandboxes(_env_worker()).sandbox_backend == "docker"
    with pytest.raises(backends.SandboxError, match="needs an image"):  # docker it is: it asks for its image
        SandboxSpec().create()
    monkeypatch.setenv("ROLLOUT_SANDBOX_BACKEND", "bwrap")
    configure_sandboxes(_env_worker())
    kind, text = _made_by(SandboxSpec())
    assert kind is BwrapSandbox and "from-42" in text


def test_an_unknown_backend_is_refused_by_the_cli(capsys):
    with pytest.raises(SystemExit) as e:
        _env_worker("--sandbox", "nsjail")
    assert e.value.code == 2
    assert "invalid choice: 'nsjail'" in capsys.readouterr().err


def test_a_swe_episode_runs_in_a_container_when_the_worker_says_docker(docker_env, docker_url):
    from tests.env_workers.envs.test_swe import the_fix

    _, image, made = docker_env
    configure_sandboxes(_env_worker("--sandbox", "docker", "--sandbox-image", image,
                                    "--sandbox-docker-url", docker_url))
    pools = Pools(PoolSize(warm=0, cap=2))
    try:
        claims = pools.claims()
        env, repo = SweEnv(resources=claims), generate(4)
        env.reset({"seed": 4})
        r = env.step("```bash\npython3 -m unittest 2>&1 | tail -1\n```")
        assert "FAILED" in r.observation[0].content
        (box,) = [h.value for h in claims.held]
        assert isinstance(box.sandbox, DockerSandbox)
        made.append(box.sandbox.container.id)
        path, bad, good = the_fix(repo)
        env.step(f"```replace {path}\n{bad}\n=======\n{good}\n```")
        done = env.step("submit")
        assert done.terminated and done.reward == 1.0
    finally:
        pools.close()
