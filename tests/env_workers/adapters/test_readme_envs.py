"""The README's "bring your own env in 20 lines" examples run as written, and pass `check_env`."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import gymnasium

from env_workers import registry
from env_workers.checker import check_env

README = Path(__file__).resolve().parents[3] / "README.md"


def _blocks() -> list[str]:
    text = README.read_text()
    section = text[text.index("### Bring your own env in 20 lines"):]
    section = section[:section.index("\n## ")]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_three_examples_of_at_most_20_lines():
    blocks = _blocks()
    assert len(blocks) == 3
    assert all(len([ln for ln in b.splitlines() if ln.strip()]) <= 20 for b in blocks)


def test_our_protocol_example(monkeypatch):
    # the built-ins register into the real table first: imported under the copy, they would vanish with it
    # and every later test in the process would find no environment at all
    registry.names()
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # leave the real table as it was
    exec(_blocks()[0], {})
    check_env("echo")
    env = registry.make("echo")
    env.reset({"word": "cat"})
    assert env.step("cat").reward == 1.0


def test_gymnasium_example(tmp_path, monkeypatch):
    (tmp_path / "readme_echo_gym.py").write_text(_blocks()[1].replace("mypkg/Echo-v0", "readme/Echo-v0"))
    monkeypatch.syspath_prepend(str(tmp_path))
    name = "gymnasium:readme_echo_gym:readme/Echo-v0"
    check_env(name)
    env = registry.make(name)
    obs, _ = env.reset({"seed": 0})
    assert env.step(obs[-1].content).reward == 1.0
    gymnasium.registry.pop("readme/Echo-v0", None)
    sys.modules.pop("readme_echo_gym", None)


def test_verifiers_example(tmp_path, monkeypatch):
    (tmp_path / "readme_echo_vf.py").write_text(_blocks()[2])
    monkeypatch.syspath_prepend(str(tmp_path))
    check_env("verifiers:readme_echo_vf")
    env = registry.make("verifiers:readme_echo_vf")
    obs, _ = env.reset({"index": 1})
    assert env.step(obs[-1].content.split(": ")[1]).reward == 1.0
    env.close()
