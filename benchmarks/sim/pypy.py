"""Run a simulator benchmark under PyPy: the same numbers, about 1.6x as fast on large cells.

The simulator and the scheduler classes it drives are pure Python with nothing third-party on
their path, so PyPy's JIT runs them as they are, but for two things Debian's PyPy (7.3.11,
Python 3.9) lacks:
- `dataclass(slots=True)` (3.10): the flag is dropped; slots save memory, nothing here needs them;
- the `wire` package (pydantic models with 3.10 unions): the simulator reaches it only through
  `scheduler.jobs`' transition table, which needs `TrajectoryState`'s member names; they are read
  from `wire/batches.py`'s source (not imported) into a plain enum of the same names.
Floats are IEEE doubles and `random` the same generator with the same pure-Python draws on both
interpreters, so every number a run writes is CPython's (`tests/benchmarks/test_pypy.py` runs one
cell on both and compares every field).

    apt install pypy3
    pypy3 benchmarks/sim/pypy.py benchmarks/pd_allocation.py --models qwen3-30b-a3b-dp8ep8 --gpus 128 --out dp8.json

On CPython it just runs the script. Under PyPy, `wire` is always the stand-in (a PyPy has no
pydantic unless one installs it).
"""

import ast
import dataclasses
import enum
import runpy
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _trajectory_states() -> list[str]:
    """`wire.TrajectoryState`'s member names, from its source."""
    tree = ast.parse((ROOT / "wire" / "batches.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TrajectoryState")
    return [t.id for n in cls.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)]


def _shim() -> None:
    if sys.version_info < (3, 10):
        plain = dataclasses.dataclass

        def dataclass(cls=None, **kw):
            kw.pop("slots", None)
            return plain(**kw) if cls is None else plain(cls, **kw)

        dataclasses.dataclass = dataclass
    wire = types.ModuleType("wire")
    wire.TrajectoryState = enum.Enum("TrajectoryState", {s: s for s in _trajectory_states()}, type=str)
    sys.modules["wire"] = wire


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(f"usage: {sys.argv[0]} SCRIPT [ARGS...]  (e.g. benchmarks/pd_allocation.py --quick)")
    if sys.implementation.name == "pypy":
        _shim()
    sys.path.insert(0, str(ROOT))
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
