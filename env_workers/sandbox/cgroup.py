"""A memory cgroup per sandbox, where this machine lets us make one.

    cg = MemoryCgroup.create("sandbox-1", limit_mb=512)   # or raises CgroupUnavailable(why)
    proc = cg.popen(argv, **popen_kwargs)   # the process is inside before it runs anything
    cg.kill()                                # SIGKILL everything in it
    cg.remove()                              # False while the killed are still dying

The group sits below the calling process's own memory cgroup (in `rollout-sandboxes/`), so a
limit set on the env worker (its container, its systemd unit) still holds its sandboxes. The
limit covers everything the kernel charges to the group: the memory of all its processes
together, their kernel memory, and the tmpfs pages they write (/tmp, the workspace). Swap is
included where the kernel accounts it, so the group cannot page out past the limit.

Works with cgroup v1's `memory` hierarchy (writable by root) and with cgroup v2 where the
memory controller can be enabled below our own cgroup (root, and a cgroup that allows it: v2
forbids controllers below a cgroup that itself holds processes, except the root one).
Anything else raises `CgroupUnavailable` with the reason; the caller falls back to
per-process limits and says so.

Non-goals: cpu and pids controllers (rlimits cover those per process and per uid), systemd's
D-Bus API, and machines where only a cgroup manager may write cgroups.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

PARENT = "rollout-sandboxes"


class CgroupUnavailable(Exception):
    """No memory cgroup can be made here; the message says why."""


@dataclass(slots=True)
class MemoryCgroup:
    path: Path
    version: int

    @classmethod
    def create(cls, name: str, limit_mb: int) -> "MemoryCgroup":
        """The group `name` with `limit_mb`; an existing one (left by a crashed process) is
        emptied and reused."""
        own, version = _own_memory_cgroup()
        parent = own / PARENT
        try:
            if version == 2:
                _enable_memory(own)
            parent.mkdir(exist_ok=True)
            if version == 2:
                _enable_memory(parent)
            path = parent / name
            path.mkdir(exist_ok=True)
        except OSError as e:
            raise CgroupUnavailable(f"cannot create a memory cgroup under {own}: {e.strerror or e}") from e
        cg = cls(path, version)
        cg.kill()
        limit = str(limit_mb << 20)
        try:
            if version == 1:
                # memsw (memory + swap) may never be below the memory limit: lift it, then set both.
                memsw = path / "memory.memsw.limit_in_bytes"
                if memsw.exists():
                    memsw.write_text("-1")
                (path / "memory.limit_in_bytes").write_text(limit)
                if memsw.exists():
                    memsw.write_text(limit)
            else:
                (path / "memory.max").write_text(limit)
                if (path / "memory.swap.max").exists():
                    (path / "memory.swap.max").write_text("0")
        except OSError as e:
            cg.remove()
            raise CgroupUnavailable(f"cannot set a memory limit in {path}: {e.strerror or e}") from e
        return cg

    @classmethod
    def existing(cls) -> list["MemoryCgroup"]:
        """Every group under our parent folder: live sandboxes' and leftovers alike."""
        own, version = _own_memory_cgroup()
        return [cls(p, version) for p in (own / PARENT).glob("*") if p.is_dir()]

    def popen(self, argv: list[str], **kw) -> subprocess.Popen:
        """Start `argv` inside the group. The child stops itself before it execs anything;
        we move it in (as whoever we are: the child may already run as an unprivileged uid,
        which cgroup v2 would not let move itself) and let it go on."""
        gate = ["/bin/sh", "-c", 'kill -STOP $$ && exec "$@"', "sh", *argv]
        proc = subprocess.Popen(gate, **kw)
        _, status = os.waitpid(proc.pid, os.WUNTRACED)
        if not os.WIFSTOPPED(status):  # it died first (we reaped it): report that
            proc.returncode = os.waitstatus_to_exitcode(status)
            raise OSError(f"the process exited before it could join {self.path}")
        try:
            (self.path / "cgroup.procs").write_text(str(proc.pid))
        except OSError:
            os.kill(proc.pid, signal.SIGKILL)
            os.kill(proc.pid, signal.SIGCONT)
            proc.wait()
            raise
        os.kill(proc.pid, signal.SIGCONT)
        return proc

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def kill(self) -> None:
        """SIGKILL every process in the group, including any forked while we looked (a
        process cannot leave a cgroup on its own). Deaths finish a moment later."""
        killed: set[int] = set()
        for _ in range(100):
            new = [p for p in self.pids() if p not in killed]
            if not new:
                return
            for pid in new:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                killed.add(pid)

    def remove(self) -> bool:
        """Delete the group if it is empty (or gone): whether it is gone. Processes just
        killed may still be dying (a pid namespace takes a moment): then try again later."""
        try:
            self.path.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            return False
        return True


def _own_memory_cgroup() -> tuple[Path, int]:
    """(the folder of our own memory cgroup, its cgroup version)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError as e:
        raise CgroupUnavailable(f"cannot read our cgroup: {e}") from e
    v1 = {ctl: path for _, ctls, path in (ln.split(":", 2) for ln in lines) for ctl in ctls.split(",")}
    for m in mounts:
        fields = m.split()
        root, point, fstype, opts = fields[3], fields[4], fields[-3], fields[-1]
        if fstype == "cgroup" and "memory" in opts.split(",") and "memory" in v1:
            version, rel = 1, v1["memory"]
        elif fstype == "cgroup2" and "memory" in _read(Path(point) / "cgroup.controllers").split():
            version, rel = 2, v1.get("", "/")
        else:
            continue
        # A mount of part of the hierarchy (a container's view) shows paths from its own root.
        rel = rel[len(root):] if root != "/" and rel.startswith(root) else rel
        own = Path(point) / rel.lstrip("/")
        if own.is_dir():
            return own, version
    raise CgroupUnavailable("no memory cgroup hierarchy is mounted here")


def _enable_memory(cgroup: Path) -> None:
    """cgroup v2: let `cgroup`'s children use the memory controller."""
    if "memory" not in _read(cgroup / "cgroup.subtree_control").split():
        (cgroup / "cgroup.subtree_control").write_text("+memory")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
