"""The Docker backend: one container per sandbox, driven by the `docker` SDK.

Used when a Docker engine (or podman serving the Docker API: `rollout_service/local/podman.py`)
is reachable.
Each `exec` and `spawn` is a `docker exec` into the sandbox's container.

What is isolated:
- **Network**: `network_mode="none"` (only loopback) unless `Limits.network`, which uses the
  engine's default network.
- **Files**: the image's root filesystem, mounted read-only; a private tmpfs at /workspace
  (sized `Limits.disk_mb`) and at /tmp (sized `Limits.tmp_mb`). Nothing of the host is mounted.
- **Processes**: the container's own pid namespace, run as uid 65534 with every capability
  dropped and `no-new-privileges`. `close()` removes the container, killing everything in it.
- **Environment**: exactly `_ENV` (and what the engine adds itself: podman sets `container`
  and `HOSTNAME`); nothing of the env worker's environment is passed, to the container or to
  an exec.
- **Resources**, all enforced by the engine: memory (and swap) of the whole container in a
  memory cgroup, which also holds the tmpfs pages of /tmp and the workspace (files there are
  memory); process count in a pids cgroup; CPU time per process (RLIMIT_CPU); file size
  (RLIMIT_FSIZE).

What is NOT isolated:
- The kernel is shared (as with any container): a kernel exploit escapes. The engine's
  default seccomp profile applies, nothing stricter.
- Whoever can reach the Docker socket is root on that host: the socket must not be given to
  anything running inside a sandbox (it never is here).
- A `spawn`ed process whose terminal we close keeps running until `close()` removes the
  container (Docker has no "kill this exec").
- The wall-clock timeout of an exec is enforced inside the container (`timeout -s KILL`),
  and so is the output cap (`head -c`, which ends a chatty process with SIGPIPE).
"""

from __future__ import annotations

import contextlib
import io
import math
import posixpath
import re
import select
import socket
import struct
import tarfile
import time
import uuid

from env_workers.sandbox.base import WORKSPACE, ExecResult, Limits, SandboxClosed, SandboxError

_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME": WORKSPACE, "LANG": "C.UTF-8", "TERM": "dumb"}
# pid 1: a shell that sleeps and, through `wait`, reaps the orphans reparented to it.
_INIT = ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait; done"]
LABEL = "rollout-sandbox"
# Each exec first reads one line from its stdin, which we send once attached (see `exec`).
GATE = "IFS= read -r _rs_gate; "
START_S = 120.0  # longest wait for an interactive session to announce itself


def _raw(sock) -> socket.socket:
    return getattr(sock, "_sock", sock)  # the SDK wraps the hijacked socket in a SocketIO


class DockerTerminal:
    """A `docker exec` on a tty. Closing it kills its session first: a tty stream nobody
    reads any more blocks the engine, and then the container cannot be removed."""

    def __init__(self, sandbox: "DockerSandbox", sock, pid: int, pending: bytes) -> None:
        self._sandbox, self._sock, self._pid, self._pending = sandbox, _raw(sock), pid, pending

    def write(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except (OSError, AttributeError) as e:
            raise EOFError("terminal closed") from e

    def read(self, timeout_s: float) -> bytes:
        if self._sock is None:
            raise EOFError("terminal closed")
        if self._pending:
            data, self._pending = self._pending, b""
            return data
        ready, _, _ = select.select([self._sock], [], [], max(timeout_s, 0.0))
        if not ready:
            return b""
        try:
            data = self._sock.recv(65536)
        except OSError:
            data = b""
        if not data:
            raise EOFError("process exited")
        return data

    def close(self) -> None:
        if self._sock is None:
            return
        with contextlib.suppress(SandboxError):
            self._sandbox._kill_session(self._pid)
        # Read what the engine still holds until it hangs up: podman's conmon blocks on
        # undelivered output, and then its zombie keeps the container from being removed.
        with contextlib.suppress(OSError):
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                ready, _, _ = select.select([self._sock], [], [], deadline - time.monotonic())
                if ready and not self._sock.recv(65536):
                    break
        self._sock.close()
        self._sock = None


class DockerSandbox:
    def __init__(self, client, image: str, limits: Limits | None = None) -> None:
        import docker.errors
        from docker.types import Ulimit

        self.limits = lim = limits or Limits()
        self.id = uuid.uuid4().hex[:12]
        self._client, self._api = client, client.api
        try:
            self.container = client.containers.run(
                image, _INIT, detach=True, name=f"sandbox-{self.id}", hostname="sandbox",
                network_mode=None if lim.network else "none",
                mem_limit=f"{lim.memory_mb}m", memswap_limit=f"{lim.memory_mb}m", pids_limit=lim.processes,
                # nofile/nproc must be given explicitly under podman (see PLATFORM.md); the
                # process count itself is the pids cgroup's job.
                ulimits=[Ulimit(name="nofile", soft=1024, hard=1024), Ulimit(name="nproc", soft=4096, hard=4096),
                         Ulimit(name="cpu", soft=lim.cpu_s, hard=lim.cpu_s),
                         Ulimit(name="fsize", soft=lim.file_mb << 20, hard=lim.file_mb << 20),
                         Ulimit(name="core", soft=0, hard=0)],
                read_only=True,
                tmpfs={WORKSPACE: f"size={lim.disk_mb}m,mode=1777", "/tmp": f"size={lim.tmp_mb}m,mode=1777"},
                working_dir=WORKSPACE, user="65534:65534", cap_drop=["ALL"], security_opt=["no-new-privileges"],
                environment=_ENV, labels={LABEL: self.id})
        except docker.errors.DockerException as e:
            raise SandboxError(f"could not start a container from {image}: {e}") from e
        self._terms: list[DockerTerminal] = []
        self._closed = False

    def _check(self) -> None:
        if self._closed:
            raise SandboxClosed(f"sandbox {self.id} is closed")

    def exec(self, argv: list[str], *, timeout_s: float | None = None, stdin: bytes | None = None) -> ExecResult:
        import docker.errors

        self._check()
        t0 = time.monotonic()
        limit = timeout_s or self.limits.timeout_s
        try:
            # `head` caps the output inside the container: a stream we stop reading would leave
            # the engine blocked on it, and the container impossible to remove.
            # The command waits for a gate line on stdin (GATE), sent once we are attached: an
            # exec whose output comes before the client attaches can lose it (seen with podman
            # under load: exit 0, no output).
            cmd = ["timeout", "-s", "KILL", str(math.ceil(limit)), "sh", "-c",
                   f'{GATE}set -o pipefail; "$@" 2>&1 | head -c {self.limits.output_bytes + 1}', "sh", *argv]
            eid = self._api.exec_create(self.container.id, cmd, workdir=WORKSPACE, stdin=True)["Id"]
            sock = _raw(self._api.exec_start(eid, socket=True))
        except docker.errors.DockerException as e:
            raise SandboxError(f"exec failed: {e}") from e
        try:
            sock.sendall(b"\n" + (stdin or b""))
            sock.shutdown(socket.SHUT_WR)  # the end of the command's stdin
        except OSError:
            pass  # the command exited without reading it all: its output says what happened
        try:
            # The in-container `timeout` kills at `limit`; we wait a little longer for it.
            out, eof, over = _demux(sock, t0 + limit + 2.0, self.limits.output_bytes)
        finally:
            sock.close()
        code = self._exit_code(eid) if eof else None
        duration = time.monotonic() - t0
        timed_out = not eof or (code == 137 and duration >= limit - 0.05)
        return ExecResult(None if timed_out else code, out, timed_out, over, duration)

    def _exit_code(self, eid: str) -> int | None:
        for _ in range(50):  # the stream can end a moment before the engine records the exit
            info = self._api.exec_inspect(eid)
            if not info.get("Running"):
                return info.get("ExitCode")
            time.sleep(0.01)
        return None

    def spawn(self, argv: list[str]) -> DockerTerminal:
        import docker.errors

        self._check()
        # Print our pid (in the container) first, so that close() can kill the whole session.
        argv = ["sh", "-c", GATE + 'echo "__RS_PID_$$"; exec "$@"', "sh", *argv]
        try:
            eid = self._api.exec_create(self.container.id, argv, stdin=True, tty=True, workdir=WORKSPACE)["Id"]
            sock = _raw(self._api.exec_start(eid, socket=True, tty=True))
        except docker.errors.DockerException as e:
            raise SandboxError(f"exec failed: {e}") from e
        with contextlib.suppress(docker.errors.DockerException):
            self._api.exec_resize(eid, height=50, width=200)  # only cosmetic: a wider terminal
        try:
            sock.sendall(b"\n")  # open the gate: we are attached
        except OSError as e:
            sock.close()
            raise SandboxError(f"could not start {argv[4:]!r} in the sandbox: {e}") from e
        head, deadline = b"", time.monotonic() + START_S
        while (m := re.search(rb"__RS_PID_(\d+)\r?\n", head)) is None:
            ready, _, _ = select.select([sock], [], [], max(deadline - time.monotonic(), 0))
            chunk = sock.recv(4096) if ready else b""
            if not chunk:
                sock.close()
                why = "it ended" if ready else f"no answer in {START_S:.0f} s"
                raise SandboxError(f"could not start {argv[4:]!r} in the sandbox ({why})")
            head += chunk
        term = DockerTerminal(self, sock, int(m.group(1)), head[m.end():])
        self._terms.append(term)
        return term

    def _kill_session(self, sid: int) -> None:
        # Every process of the terminal's session (job control puts jobs in their own groups).
        script = ('for p in /proc/[0-9]*; do s=$(sed "s/.*) //" $p/stat 2>/dev/null | cut -d" " -f4); '
                  f'[ "$s" = {sid} ] && kill -9 ${{p#/proc/}} 2>/dev/null; done; true')
        self.exec(["sh", "-c", script], timeout_s=5)

    def write_file(self, path: str, data: bytes) -> None:
        import docker.errors

        self._check()
        full = posixpath.join(WORKSPACE, path)
        folder, name = posixpath.split(full)
        r = self.exec(["mkdir", "-p", "--", folder])
        if r.exit_code != 0:
            raise OSError(f"cannot write {path}: {r.text.strip()}")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.uid, info.gid, info.mtime = len(data), 0o644, 65534, 65534, int(time.time())
            t.addfile(info, io.BytesIO(data))
        try:
            # The engine resolves the path inside the container, so a symlink cannot point it at the host.
            ok = self.container.put_archive(folder, buf.getvalue())
        except docker.errors.DockerException as e:
            raise OSError(f"cannot write {path}: {e}") from e
        if not ok:
            raise OSError(f"cannot write {path}")

    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        r = self.exec(["cat", "--", path])
        if r.exit_code != 0:
            raise OSError(r.text.strip() or f"cannot read {path}")
        return r.output[:max_bytes] if max_bytes else r.output

    def close(self) -> None:
        import docker.errors

        if self._closed:
            return
        for term in self._terms:
            term.close()
        self._closed = True
        for attempt in range(3):
            try:
                self.container.remove(force=True)
                return
            except docker.errors.NotFound:
                return
            except docker.errors.APIError as e:  # e.g. an exec stuck on its output: kill, then retry
                err = e
                with contextlib.suppress(docker.errors.APIError):
                    self.container.kill()
                time.sleep(0.5 * (attempt + 1))
        raise SandboxError(f"could not remove container {self.container.id[:12]}: {err}")

    def __enter__(self) -> "DockerSandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _demux(sock: socket.socket, deadline: float, cap: int) -> tuple[bytes, bool, bool]:
    """Docker's multiplexed exec stream (8-byte frame headers) -> (output, eof, over_cap)."""
    raw, out = bytearray(), bytearray()
    while True:
        while len(raw) >= 8:
            size = struct.unpack(">I", raw[4:8])[0]
            if len(raw) < 8 + size:
                break
            out += raw[8:8 + size][: cap + 1 - len(out)]  # `head` bounds what comes; keep reading to EOF
            del raw[:8 + size]
        left = deadline - time.monotonic()
        if left <= 0:
            return bytes(out[:cap]), False, len(out) > cap
        ready, _, _ = select.select([sock], [], [], left)
        if not ready:
            continue
        chunk = sock.recv(65536)
        if not chunk:
            return bytes(out[:cap]), True, len(out) > cap
        raw += chunk
