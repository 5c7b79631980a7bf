"""`rollout envs`: what an env worker here would host, as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.getcwd(), COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "rollout_service.cli", "envs", *args], capture_output=True,
                          text=True, env=env, timeout=120)


def test_lists_builtins_and_installed_families_with_versions():
    out = _run()
    assert out.returncode == 0, out.stderr
    assert "calc" in out.stdout and "multi-turn arithmetic" in out.stdout
    assert "reasoning_gym:NAME" in out.stdout and "reasoning-gym 0.1.25" in out.stdout
    assert "gymnasium 1.4.0" in out.stdout and "verifiers 0.3.1" in out.stdout


def test_lists_a_familys_names_and_refuses_an_unknown_family():
    out = _run("reasoning_gym")
    assert out.returncode == 0 and "reasoning_gym:leg_counting" in out.stdout
    bad = _run("no_such_family")
    assert bad.returncode != 0 and "unknown family" in bad.stderr
