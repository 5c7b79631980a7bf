"""The sandbox plug point: a `Sandbox` protocol, its `Limits`, its results and its errors.

    sb = BwrapSandbox(Limits(memory_mb=512))           # or DockerSandbox(client, image, limits)
    r = sb.exec(["sh", "-c", "echo hi > f && cat f"])   # ExecResult(exit_code=0, output=b"hi\n", ...)
    term = sb.spawn(["bash"])                           # a long-lived process on a pseudo-terminal
    sb.close()                                          # kills every process it started

A sandbox is a writable workspace plus a way to run processes inside it. Backends differ
in *how* they isolate (see `bwrap.py` and `docker.py`, whose docstrings say exactly what is
and is not isolated, and which limit is enforced where); every backend honours the same
`Limits`, never has network unless `Limits.network` is set, passes no variable of the host's
environment into a sandbox, and `close()` leaves no process behind.

Non-goals: scheduling and reuse of sandboxes (that is `env_workers/resources.py`), and the
tool protocols spoken over a terminal (that is `env_workers/tools.py`).

Errors:

    SandboxError            the sandbox itself failed (could not start, died, was closed):
    └── SandboxClosed       an infrastructure failure of kind `sandbox`, not the model's fault
"""

from __future__ import annotations

import select
import time
from dataclasses import dataclass
from typing import Protocol

WORKSPACE = "/workspace"


@dataclass(slots=True, frozen=True)
class Limits:
    """Per-sandbox limits. Defaults suit a coding agent on a small machine."""

    memory_mb: int = 1024        # all processes, /tmp and the workspace together (a memory cgroup);
                                 # bwrap where no cgroup can be made: address space per process
    processes: int = 128         # bwrap: per sandbox uid (when root) or per user; docker: pids cgroup
    cpu_s: int = 120             # CPU seconds per process (RLIMIT_CPU), then SIGKILL
    file_mb: int = 256           # largest file a process may write (RLIMIT_FSIZE)
    disk_mb: int = 1024          # the workspace (a tmpfs); bwrap without root: not enforced
    tmp_mb: int = 64             # /tmp (a tmpfs); files there and in the workspace are memory
    output_bytes: int = 64 * 1024  # what one exec or tool call returns; the rest is dropped
    timeout_s: float = 30.0      # default wall-clock limit of one exec
    network: bool = False        # off unless the environment asks; then the host's network


@dataclass(slots=True)
class ExecResult:
    exit_code: int | None        # None when the process was killed for a timeout
    output: bytes                # stdout and stderr interleaved, at most Limits.output_bytes
    timed_out: bool = False
    truncated: bool = False      # output went past the cap; the rest was dropped
    duration_s: float = 0.0

    @property
    def text(self) -> str:
        return self.output.decode("utf-8", "replace")


class SandboxError(Exception):
    """The sandbox failed (not the code running in it): an infrastructure failure."""


class SandboxClosed(SandboxError):
    pass


class Terminal(Protocol):
    """A process on a pseudo-terminal. `read` returns b"" on timeout and raises EOFError once
    the process has gone; `close` kills it."""

    def write(self, data: bytes) -> None: ...

    def read(self, timeout_s: float) -> bytes: ...

    def close(self) -> None: ...


class Sandbox(Protocol):
    id: str
    limits: Limits

    def exec(self, argv: list[str], *, timeout_s: float | None = None, stdin: bytes | None = None) -> ExecResult: ...

    def spawn(self, argv: list[str]) -> Terminal: ...

    def write_file(self, path: str, data: bytes) -> None: ...

    def read_file(self, path: str, max_bytes: int | None = None) -> bytes: ...

    def close(self) -> None: ...


def drain(fd_or_sock, deadline: float, cap: int) -> tuple[bytes, bool, bool]:
    """Read a pipe or socket until EOF, the deadline or `cap` bytes: (data, eof, over_cap).

    Shared by backends so that a chatty process can never make us buffer without bound."""
    out = bytearray()
    read = (lambda: fd_or_sock.recv(65536)) if hasattr(fd_or_sock, "recv") else (lambda: _os_read(fd_or_sock))
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return bytes(out), False, False
        ready, _, _ = select.select([fd_or_sock], [], [], left)
        if not ready:
            continue
        chunk = read()
        if not chunk:
            return bytes(out), True, False
        out += chunk
        if len(out) > cap:
            return bytes(out[:cap]), False, True


def _os_read(fd: int) -> bytes:
    import os

    try:
        return os.read(fd, 65536)
    except OSError:  # EIO: the other end of a pty closed
        return b""
