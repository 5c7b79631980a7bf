"""The default sandbox backend: bubblewrap (rootless, no daemon; works on HPC nodes).

Every `exec` and every `spawn` is one `bwrap` process tree. All of them share the sandbox's
workspace (a host folder bind-mounted at /workspace) and, when we run as root, a host uid of
their own, taken from a range and locked for the sandbox's lifetime.

What is isolated:
- **Network**: a new network namespace with only loopback (unless `Limits.network`).
- **Files**: a new mount namespace whose root is a read-only tmpfs holding /usr (read-only,
  the host's), a few read-only files of /etc, a private /tmp (a fresh tmpfs per exec/spawn)
  and /dev, a /proc of the sandbox's own pid namespace, and the writable workspace. Nothing
  else of the host is visible: not /root, /home, /work, /var, the Docker or Redis sockets,
  nor another sandbox's workspace.
- **Processes**: a new pid namespace per exec/spawn (killing bwrap kills everything in it,
  `--die-with-parent` included), no capabilities, no new privileges, and under root a uid
  per sandbox so that a sandbox cannot signal or read another's processes and files even by
  a kernel path we did not think of. `close()` also kills every process still owned by that
  uid (and everything in its cgroup).
- **Environment**: bwrap itself starts with only PATH, HOME, LANG and TERM (it is pid 1 of
  the sandbox, and its /proc/1/environ is readable from inside), and so does the command
  (`--clearenv`). No variable of the env worker reaches a sandbox.

What is enforced where:
- **Memory, /tmp and workspace together**: where we can make a memory cgroup (`cgroup.py`:
  root with cgroup v1, or v2 with the controller delegable), all processes of the sandbox,
  and the tmpfs pages they write, share `memory_mb`; past it the kernel fails the write or
  OOM-kills inside the sandbox only. Elsewhere only RLIMIT_AS per process holds (worst case
  `processes x memory_mb`), and a warning says so once. RLIMIT_AS applies in both cases.
- **/tmp**: a tmpfs of `tmp_mb` per exec/spawn (bwrap's `--size`; where bwrap is too old to
  have it, /tmp is uncapped but still counts against the cgroup; a warning says so).
- **Workspace**: under root, a tmpfs of `disk_mb` mounted on the host at the workspace folder
  (so it lives in memory and counts against the cgroup). Without root it is a plain folder:
  no quota beyond RLIMIT_FSIZE per file, a warning says so.
- CPU time per process (RLIMIT_CPU); wall time per exec; processes per uid (RLIMIT_NPROC):
  exact per sandbox under root; without root every sandbox of the user shares one count
  with the user's other processes.
`sb.enforced` says which of the first three hold for a sandbox, and why not.

What is NOT isolated (know this before trusting it with hostile code):
- The kernel is shared: a kernel exploit escapes. No seccomp filter is installed.
- /usr is the host's: installed programs and libraries are readable (not writable).
- bwrap's command line (/proc/1/cmdline inside) names the workspace's host folder.
- With `Limits.network=True` the sandbox shares the host's network entirely.
- A workspace tmpfs left mounted by a killed env worker is unmounted when a later sandbox
  here starts (see `_reap`), not before.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import logging
import os
import pty
import select
import shutil
import signal
import struct
import subprocess
import tempfile
import termios
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from env_workers.sandbox.base import WORKSPACE, ExecResult, Limits, SandboxClosed, SandboxError, drain
from env_workers.sandbox.cgroup import CgroupUnavailable, MemoryCgroup

log = logging.getLogger(__name__)

UID_BASE, UID_COUNT = 1_200_000, 4096  # far above any real user's uid
_ETC = ["alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf",
        "passwd", "group", "mime.types"]
_ETC_NET = ["resolv.conf", "hosts", "ssl", "ca-certificates"]
_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
# All a sandbox's processes see, bwrap's own included: nothing is inherited from the env worker.
ENV = {"PATH": _PATH, "HOME": WORKSPACE, "LANG": "C.UTF-8", "TERM": "dumb"}


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
            if (fd := _try_lock(lock_dir, uid)) is not None:
                self.uid, self._fd = uid, fd
                return
        raise SandboxError(f"all {UID_COUNT} sandbox uids are in use")

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _try_lock(lock_dir: Path, uid: int) -> int | None:
    """An fd holding `uid`'s lock, or None when a sandbox (of any process) holds it."""
    fd = os.open(lock_dir / str(uid), os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


@dataclass(slots=True, frozen=True)
class Enforced:
    """Which limits hold for one sandbox on this machine (the module docstring says why each
    may not)."""

    memory: str               # "cgroup v1"/"cgroup v2": all processes and tmpfs together; or "per process (why)"
    workspace_mb: int | None  # the workspace's cap (a tmpfs), None: a plain folder, uncapped
    tmp_mb: int | None        # /tmp's cap, None: bwrap too old for --size


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
        self._bin = {name: shutil.which(name) for name in ("bwrap", "prlimit", "setsid")}
        self._lease = _UidLease(base / ".uids") if self._root else None
        self.uid = self._lease.uid if self._lease else os.geteuid()
        self._cgroup: MemoryCgroup | None = None
        memory = "per process (not root)"
        if self._lease:
            groups = _groups()
            _sweep(base, groups)
            _reap(base, self.uid, groups)  # whatever a crashed process left on this uid
            _remove_dying()
            try:
                # Named for this sandbox alone: a dying group of a closed one is never reused.
                self._cgroup = MemoryCgroup.create(f"sandbox-{self.uid}-{self.id}", self.limits.memory_mb)
                memory = f"cgroup v{self._cgroup.version}"
            except CgroupUnavailable as e:
                memory = f"per process ({e})"
        if not self._cgroup:
            _warn_once(f"bwrap sandboxes: memory is limited {memory}")
        # Under root the uid prefix tells `_reap` whose workspace this is.
        self.workspace = base / (f"{self.uid}-{self.id}" if self._root else self.id)
        self._procs: list[subprocess.Popen] = []
        self._closed = False
        tmp = self.limits.tmp_mb if _bwrap_has_size(self._bin["bwrap"]) else None
        if tmp is None:
            _warn_once("bwrap sandboxes: this bwrap has no --size, so /tmp has no size cap")
        self.enforced = Enforced(memory, self._make_workspace(), tmp)

    def _make_workspace(self) -> int | None:
        """An empty workspace folder; under root a tmpfs of `disk_mb` (its size cap, returned).
        Its pages are charged to whoever writes them: the sandbox's processes, in its cgroup."""
        self.workspace.mkdir(mode=0o700)
        if not self._root:
            _warn_once("bwrap sandboxes: not root, so the workspace has no size cap")
            return None
        opts = f"size={self.limits.disk_mb}m,mode=0700,uid={self.uid},gid={self.uid}"
        if why := _mount_tmpfs(self.workspace, opts):
            _warn_once(f"bwrap sandboxes: the workspace has no size cap (cannot mount a tmpfs: {why})")
            os.chown(self.workspace, self.uid, self.uid)
            return None
        return self.limits.disk_mb

    def _drop_workspace(self) -> None:
        # Lazily: a process still dying may hold it; its memory is freed when the last one goes.
        _unmount(self.workspace)
        # rmtree never follows symlinks, so a link planted in the workspace cannot aim it elsewhere.
        shutil.rmtree(self.workspace, ignore_errors=True)

    # -- running things ------------------------------------------------------------------

    def _argv(self, argv: list[str], new_session: bool) -> list[str]:
        lim = self.limits
        rl = [self._bin["prlimit"], f"--as={lim.memory_mb << 20}", f"--nproc={lim.processes}", f"--cpu={lim.cpu_s}",
              f"--fsize={lim.file_mb << 20}", "--core=0", "--nofile=1024", "--"]
        tmp = ["--size", str(self.enforced.tmp_mb << 20)] if self.enforced.tmp_mb else []
        bw = [self._bin["bwrap"], "--unshare-all", "--die-with-parent", "--hostname", "sandbox",
              "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin",
              "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
              "--proc", "/proc", "--dev", "/dev", *tmp, "--tmpfs", "/tmp",
              "--bind", str(self.workspace), WORKSPACE, "--chdir", WORKSPACE, "--clearenv"]
        for name, value in ENV.items():
            bw += ["--setenv", name, value]
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
        # env: bwrap is the sandbox's pid 1, and its environment is readable from inside. cwd: the
        # shell that moves it into its cgroup exports PWD, which named the env worker's folder there.
        kw.update(env=dict(ENV), cwd="/", close_fds=True, preexec_fn=_default_signals)
        try:
            proc = self._cgroup.popen(argv, **kw) if self._cgroup else subprocess.Popen(argv, **kw)
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
            proc = self._popen([self._bin["setsid"], "-c", *self._argv(argv, new_session=False)],
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
        (How a `global`-scope pool reuses a sandbox; see env_workers/resources.py.)"""
        if self._closed:
            raise SandboxClosed(f"sandbox {self.id} is closed")
        for p in self._procs:
            _kill_group(p)
        self._procs = []
        self._kill_all()
        self._drop_workspace()
        if self.workspace.exists():
            raise SandboxError(f"could not empty the workspace of sandbox {self.id}")
        self._make_workspace()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for p in self._procs:
            _kill_group(p)
        self._kill_all()
        self._drop_workspace()
        _remove_dying(self._cgroup)
        if self._lease:
            self._lease.release()

    def _kill_all(self) -> None:
        """Backstops: whatever still runs in the sandbox's cgroup or as its uid."""
        if self._cgroup:
            self._cgroup.kill()
        if self._root:
            _kill_uid(self.uid)

    def __enter__(self) -> "BwrapSandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -- what the machine allows, and leftovers ------------------------------------------------

_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


@functools.cache
def _bwrap_has_size(bwrap: str) -> bool:
    out = subprocess.run([bwrap, "--help"], capture_output=True, text=True, env=dict(ENV))
    return "--size" in out.stdout + out.stderr


_libc = ctypes.CDLL(None, use_errno=True)
_MS_NOSUID, _MS_NODEV, _MNT_DETACH = 2, 4, 2


def _mount_tmpfs(path: Path, opts: str) -> str | None:
    """Mount a tmpfs at `path`: None, or why not."""
    if _libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts.encode()) != 0:
        return os.strerror(ctypes.get_errno())
    return None


def _unmount(path: Path) -> None:
    _libc.umount2(os.fsencode(path), _MNT_DETACH)  # EINVAL when nothing is mounted there: fine


_dying: list[MemoryCgroup] = []  # closed sandboxes' groups, removed once their processes are gone
_dying_lock = threading.Lock()


def _remove_dying(*cgroups: MemoryCgroup | None) -> None:
    with _dying_lock:
        _dying[:] = [cg for cg in [*_dying, *cgroups] if cg and not cg.remove()]


def _groups() -> list[MemoryCgroup]:
    try:
        return MemoryCgroup.existing()
    except CgroupUnavailable:
        return []


def _reap(base: Path, uid: int, groups: list[MemoryCgroup]) -> None:
    """Unmount and delete the workspaces of `uid`'s sandboxes, and end their cgroups; call with
    `uid`'s lock held (so none of them is live). A killed env worker leaves its workspace tmpfs
    mounted: memory that nobody frees otherwise."""
    for ws in base.glob(f"{uid}-*"):
        _unmount(ws)
        shutil.rmtree(ws, ignore_errors=True)
    for cg in groups:
        if cg.path.name.startswith(f"sandbox-{uid}-"):
            cg.kill()  # already dead, as a rule: they die with their env worker (--die-with-parent)
            _remove_dying(cg)


_swept: set[Path] = set()


def _sweep(base: Path, groups: list[MemoryCgroup]) -> None:
    """Once per process: `_reap` every uid with a workspace here whose lock nobody holds.
    (Only uids seen here: uid locks are per `base`.)"""
    if base in _swept:
        return
    _swept.add(base)
    for uid in {int(n) for n, _, _ in (p.name.partition("-") for p in base.glob("*-*")) if n.isdigit()}:
        if (fd := _try_lock(base / ".uids", uid)) is not None:
            try:
                _reap(base, uid, groups)
            finally:
                os.close(fd)


def _default_signals() -> None:
    """In the child, before it execs bwrap: no signal blocked, the ones a terminal sends at their
    defaults. Ignored and blocked signals survive exec, and bash cannot reset a signal ignored on
    entry: a sandbox started while the spawning process had SIGINT ignored or blocked (for a
    moment, by any library) kept a shell that ^C never reached, so every bash timeout restarted
    it and lost its state (seen in full test runs; test_tools has the case)."""
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


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
