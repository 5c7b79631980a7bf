"""The default sandbox backend: bubblewrap (rootless, no daemon; works on HPC nodes).

Every `exec` and every `spawn` is one `bwrap` process tree. All of them share the sandbox's
workspace (a host folder bind-mounted at /workspace) and, when we run as root, a host uid of
their own, taken from a range and locked for the sandbox's lifetime.

What is isolated:
- **Network**: a new network namespace with only loopback (unless `Limits.network`).
- **Files**: a new mount namespace whose root is a read-only tmpfs holding /usr (read-only,
  the host's), a few read-only files of /etc, a private /tmp (a fresh tmpfs per exec/spawn)
  and /dev, a /proc of the sandbox's own pid namespace, and the writable workspace. Nothing else of the host is visible: not
  /root, /home, /work, /var, the Docker or Redis sockets, nor another sandbox's workspace.
- **Processes**: a new pid namespace per exec/spawn (killing bwrap kills everything in it,
  `--die-with-parent` included), no capabilities, no new privileges, and under root a uid
  per sandbox so that a sandbox cannot signal or read another's processes and files even by
  a kernel path we did not think of. `close()` also kills every process still owned by that
  uid.
- **Environment**: variables are cleared (no host secrets leak in); HOME is the workspace.

What is NOT isolated (know this before trusting it with hostile code):
- The kernel is shared: a kernel exploit escapes. No seccomp filter is installed.
- Memory is limited per *process* (RLIMIT_AS), not per sandbox: the worst case is
  `processes x memory_mb`. CPU time is per process (RLIMIT_CPU); wall time per exec.
- The process limit (RLIMIT_NPROC) counts per uid: exact per sandbox under root; without
  root every sandbox of the user shares one count with the user's other processes.
- The workspace has no size quota; RLIMIT_FSIZE caps each file only.
- /usr is the host's: installed programs and libraries are readable (not writable).
- With `Limits.network=True` the sandbox shares the host's network entirely.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import shutil
import signal
import struct
import subprocess
import tempfile
import termios
import time
import uuid
from pathlib import Path

from env_workers.sandbox.base import WORKSPACE, ExecResult, Limits, SandboxClosed, SandboxError, drain

UID_BASE, UID_COUNT = 1_200_000, 4096  # far above any real user's uid
_ETC = ["alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf",
        "passwd", "group", "mime.types"]
_ETC_NET = ["resolv.conf", "hosts", "ssl", "ca-certificates"]
_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"


def available() -> str | None:
    """None when bwrap can run here, else why not."""
    if shutil.which("bwrap") is None:
        return "bwrap is not installed (apt-get install -y --no-install-recommends bubblewrap)"
    if shutil.which("prlimit") is None or shutil.which("setsid") is None:
        return "prlimit/setsid are missing (util-linux)"
    return None


class _UidLease:
    """A host uid used by one sandbox at a time, across processes (an flock'ed file)."""

    def __init__(self, lock_dir: Path) -> None:
        lock_dir.mkdir(parents=True, exist_ok=True)
        start = uuid.uuid4().int % UID_COUNT  # spread out so concurrent starts rarely collide
        for i in range(UID_COUNT):
            uid = UID_BASE + (start + i) % UID_COUNT
            fd = os.open(lock_dir / str(uid), os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.uid, self._fd = uid, fd
            return
        raise SandboxError(f"all {UID_COUNT} sandbox uids are in use")

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class BwrapTerminal:
    def __init__(self, proc: subprocess.Popen, master: int) -> None:
        self._proc, self._master = proc, master

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self._master, view)
            except OSError as e:
                raise EOFError("terminal closed") from e
            view = view[n:]

    def read(self, timeout_s: float) -> bytes:
        if self._master < 0:
            raise EOFError("terminal closed")
        ready, _, _ = select.select([self._master], [], [], max(timeout_s, 0.0))
        if not ready:
            return b""
        try:
            data = os.read(self._master, 65536)
        except OSError:  # EIO: every process holding the pty's other end has exited
            data = b""
        if not data:
            raise EOFError("process exited")
        return data

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def close(self) -> None:
        _kill_group(self._proc)
        if self._master >= 0:
            os.close(self._master)
            self._master = -1


class BwrapSandbox:
    """One sandbox: a workspace, a uid (under root) and the process trees started in it."""

    def __init__(self, limits: Limits | None = None, root: str | os.PathLike | None = None) -> None:
        if why := available():
            raise SandboxError(why)
        self.limits = limits or Limits()
        self.id = uuid.uuid4().hex[:12]
        base = Path(root or Path(tempfile.gettempdir()) / "rollout-sandboxes")
        base.mkdir(parents=True, exist_ok=True)
        os.chmod(base, 0o711)  # sandbox uids must traverse it to bind their workspace, not list it
        self._root = os.geteuid() == 0
        self._lease = _UidLease(base / ".uids") if self._root else None
        self.uid = self._lease.uid if self._lease else os.geteuid()
        self.workspace = base / self.id
        self.workspace.mkdir(mode=0o700)
        if self._root:
            os.chown(self.workspace, self.uid, self.uid)
        self._procs: list[subprocess.Popen] = []
        self._closed = False

    # -- running things ------------------------------------------------------------------

    def _argv(self, argv: list[str], new_session: bool) -> list[str]:
        lim = self.limits
        rl = ["prlimit", f"--as={lim.memory_mb << 20}", f"--nproc={lim.processes}", f"--cpu={lim.cpu_s}",
              f"--fsize={lim.file_mb << 20}", "--core=0", "--nofile=1024", "--"]
        bw = ["bwrap", "--unshare-all", "--die-with-parent", "--hostname", "sandbox",
              "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin",
              "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
              "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
              "--bind", str(self.workspace), WORKSPACE, "--chdir", WORKSPACE,
              "--clearenv", "--setenv", "PATH", _PATH, "--setenv", "HOME", WORKSPACE,
              "--setenv", "LANG", "C.UTF-8", "--setenv", "TERM", "dumb"]
        for name in _ETC + (_ETC_NET if lim.network else []):
            bw += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        bw += ["--remount-ro", "/"]  # the root tmpfs too: only the workspace and /tmp take writes
        if lim.network:
            bw.append("--share-net")
        if new_session:  # no controlling terminal: blocks TIOCSTI into a terminal of ours
            bw.append("--new-session")
        return rl + bw + ["--", *argv]

    def _popen(self, argv: list[str], **kw) -> subprocess.Popen:
        if self._closed:
            raise SandboxClosed(f"sandbox {self.id} is closed")
        if self._root:
            kw.update(user=self.uid, group=self.uid, extra_groups=[])
        try:
            proc = subprocess.Popen(argv, close_fds=True, **kw)
        except OSError as e:
            raise SandboxError(f"could not start bwrap: {e}") from e
        self._procs = [p for p in self._procs if p.poll() is None] + [proc]
        return proc

    def exec(self, argv: list[str], *, timeout_s: float | None = None, stdin: bytes | None = None) -> ExecResult:
        t0 = time.monotonic()
        deadline = t0 + (timeout_s or self.limits.timeout_s)
        proc = self._popen(self._argv(argv, new_session=True), stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        if stdin:
            try:
                proc.stdin.write(stdin)
                proc.stdin.close()
            except BrokenPipeError:
                pass
        out, eof, over = drain(proc.stdout.fileno(), deadline, self.limits.output_bytes)
        if not eof:  # timed out or too chatty: kill the whole tree now
            _kill_group(proc)
        code = proc.wait()
        proc.stdout.close()
        timed_out = not eof and not over
        return ExecResult(None if timed_out else code, out, timed_out, over, time.monotonic() - t0)

    def spawn(self, argv: list[str]) -> BwrapTerminal:
        master, slave = pty.openpty()
        # A wide terminal: models read `ls` and tracebacks better without wrapping.
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
        try:
            # `setsid -c` makes the pty our controlling terminal, so ^C reaches the foreground job.
            proc = self._popen(["setsid", "-c", *self._argv(argv, new_session=False)],
                               stdin=slave, stdout=slave, stderr=slave)
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        return BwrapTerminal(proc, master)

    # -- files -----------------------------------------------------------------------------
    # Through the sandbox, as its uid: a symlink planted in the workspace cannot make us
    # read or write a host file.

    def write_file(self, path: str, data: bytes) -> None:
        r = self.exec(["sh", "-c", 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"', "sh", path], stdin=data)
        if r.exit_code != 0:
            raise OSError(f"cannot write {path}: {r.text.strip()}")

    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        r = self.exec(["cat", "--", path])
        if r.exit_code != 0:
            raise OSError(r.text.strip() or f"cannot read {path}")
        return r.output[:max_bytes] if max_bytes else r.output

    # -- teardown --------------------------------------------------------------------------

    def reset(self) -> None:
        """As good as new, keeping the id and uid: every process killed, the workspace emptied.
        (How a `global`-scope pool reuses a sandbox; see scheduler/resources.py.)"""
        if self._closed:
            raise SandboxClosed(f"sandbox {self.id} is closed")
        for p in self._procs:
            _kill_group(p)
        self._procs = []
        if self._root:
            _kill_uid(self.uid)
        # rmtree never follows symlinks, so a link planted in the workspace cannot aim it elsewhere.
        shutil.rmtree(self.workspace, ignore_errors=True)
        if self.workspace.exists():
            raise SandboxError(f"could not empty the workspace of sandbox {self.id}")
        self.workspace.mkdir(mode=0o700)
        if self._root:
            os.chown(self.workspace, self.uid, self.uid)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for p in self._procs:
            _kill_group(p)
        if self._root:
            _kill_uid(self.uid)
        shutil.rmtree(self.workspace, ignore_errors=True)
        if self._lease:
            self._lease.release()

    def __enter__(self) -> "BwrapSandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
        proc.wait()


def _kill_uid(uid: int) -> None:
    """Backstop: SIGKILL whatever still runs as this sandbox's uid.

    Sweep until a pass finds nobody we have not already killed: that catches a child forked
    while we looked. We do not wait for the deaths: SIGKILL cannot be refused, and a pid
    namespace takes a second or two to finish dying."""
    killed: set[int] = set()
    for _ in range(100):
        new = False
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) in killed:
                continue
            try:
                if entry.stat().st_uid == uid:
                    os.kill(int(entry.name), signal.SIGKILL)
                    killed.add(int(entry.name))
                    new = True
            except (FileNotFoundError, ProcessLookupError):
                pass
        if not new:
            return
