"""The arrows between our packages (docs/ARCHITECTURE.md): every import statement in each
package, top-level or inside a function, is read from the source and checked against its
contract, so a forbidden import fails here the day it comes back."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = {"wire", "rollout_service", "scheduler", "env_workers", "trainer_client", "benchmarks", "examples", "tests"}
WEB = {"fastapi", "starlette", "uvicorn"}

# package -> (top-level modules it must not import, why)
FORBIDDEN = {
    "wire": (OURS - {"wire"} | {"httpx", "redis"} | WEB, "the wire types are a leaf: pydantic, msgpack and the stdlib"),
    "env_workers": (OURS - {"wire", "env_workers"}, "env workers import only the wire types, their own modules "
                                                     "and third-party packages"),
    "trainer_client": (OURS - {"wire", "trainer_client"}, "the trainer SDK imports only the wire types"),
    "scheduler": (OURS - {"wire", "scheduler"} | WEB, "the scheduler imports redis and the wire types, never a "
                                                      "web framework"),
    "rollout_service": ({"benchmarks", "examples", "tests"}, "the service never imports its tooling or tests"),
}


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, top-level module) of every absolute import in the file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module.split(".")[0]))
        elif isinstance(node, ast.ImportFrom):  # relative: we use none, so a new one gets a look
            out.append((node.lineno, "." * node.level + (node.module or "")))
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_keep_to_its_contract(package):
    banned, why = FORBIDDEN[package]
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no sources found for {package}"
    bad = [f"{p.relative_to(ROOT)}:{line} imports {mod}" for p in files for line, mod in imports(p)
           if mod in banned or mod.startswith(".")]
    assert not bad, f"{package}: {why}\n" + "\n".join(bad)


def test_the_contract_check_catches_a_forbidden_import(tmp_path):
    """The walk sees imports inside functions too (where lazy imports hide)."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from rollout_service.engines.fleet import Fleet\n")
    assert imports(f) == [(2, "rollout_service")]
