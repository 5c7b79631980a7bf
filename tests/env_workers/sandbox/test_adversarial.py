"""Hostile code in a sandbox, one property per test, on every backend (bwrap alone where the
property is its own: workspace mounts); and what `rollout up` hands its children."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import pytest

from env_workers.sandbox import Limits, SandboxError


def host_pids(sb) -> list[int]:
    """The host pids of the sandbox's processes (both backends run on this host)."""
    out = []
    for e in os.scandir("/proc"):
        if not e.name.isdigit():
            continue
        try:
            if hasattr(sb, "uid"):
                if e.stat().st_uid == sb.uid:
                    out.append(int(e.name))
            elif sb.container.id in open(f"/proc/{e.name}/cgroup").read():
                out.append(int(e.name))
        except OSError:
            pass
    return out


def host_pids_with(arg: str) -> list[int]:
    out = []
    for e in os.scandir("/proc"):
        try:
            if e.name.isdigit() and arg.encode() in open(f"/proc/{e.name}/cmdline", "rb").read():
                out.append(int(e.name))
        except OSError:
            pass
    return out


def test_no_network_from_inside(sandbox):
    with socket.socket() as srv:  # a host service on loopback that the sandbox must not reach
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        code = ("import socket\n"
                "print(sorted(n for _, n in socket.if_nameindex()))\n"
                f"for addr in [('127.0.0.1', {port}), ('1.1.1.1', 53)]:\n"
                "    try:\n"
                "        socket.create_connection(addr, timeout=1); print('CONNECTED', addr)\n"
                "    except OSError as e:\n"
                "        print('refused', addr)\n")
        r = sandbox.exec(["python3", "-c", code])
    assert r.exit_code == 0, r.text
    assert r.text.splitlines()[0] == "['lo']" and "CONNECTED" not in r.text


def test_no_write_outside_the_workspace(sandbox):
    name = f"rs-probe-{uuid.uuid4().hex[:8]}"
    home = os.path.expanduser("~")  # the host user's home, wherever it is
    targets = [f"/{name}", f"/usr/{name}", f"/etc/{name}", f"{home}/{name}", f"/var/{name}", f"/tmp/{name}"]
    script = "; ".join(f"(echo x > {t}) 2>/dev/null && echo WROTE {t}" for t in targets[:5]) + f"; echo x > /tmp/{name}"
    r = sandbox.exec(["sh", "-c", script + "; true"])
    assert "WROTE" not in r.text  # read-only everywhere but the workspace and a private /tmp
    assert not any(os.path.exists(t) for t in targets)  # and nothing reached the host


def test_fork_bomb_is_contained(make_sandbox):
    limit = 32
    # `other` gets a generous budget: on a loaded machine, beside a bomb, an exec can take seconds.
    bomb, other = make_sandbox(Limits(processes=limit, timeout_s=2)), make_sandbox(Limits(timeout_s=60))
    seen, done = [0], threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen[0] = max(seen[0], len(host_pids(bomb)))
            time.sleep(0.05)

    w = threading.Thread(target=watch)
    w.start()
    try:
        t0 = time.monotonic()
        bomb.exec(["sh", "-c", "b() { b | b & }; b; sleep 600"])  # may end early: its own shell cannot fork
        assert time.monotonic() - t0 < 60  # ended by its 2 s limit (or earlier), not by the sleep
        time.sleep(0.5)  # let the bomb press against the limit while we look
        assert other.exec(["echo", "alive"]).text == "alive\n"  # the host can still run things
    finally:
        done.set()
        w.join()
    # bwrap counts per uid (so its own bwrap processes too); docker counts the container's pids.
    assert 0 < seen[0] <= limit + 2, seen[0]
    bomb.close()
    assert gone(lambda: host_pids(bomb))


def gone(pids, within_s: float = 5.0) -> bool:
    """SIGKILLed processes vanish a moment later (a pid namespace takes a while to die)."""
    deadline = time.monotonic() + within_s
    while pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not pids()


def test_memory_hog_is_contained(make_sandbox):
    sb = make_sandbox(Limits(memory_mb=256, timeout_s=20))
    r = sb.exec(["python3", "-c", "x = [bytearray(16 << 20) for _ in range(64)]; print('ALLOCATED')"])
    assert r.exit_code not in (0, None) and "ALLOCATED" not in r.text  # MemoryError, or the OOM killer
    assert sb.exec(["echo", "ok"]).text == "ok\n"  # the sandbox itself survives


def test_process_left_running_is_killed_at_teardown(make_sandbox):
    sb = make_sandbox()
    tag = str(900000 + uuid.uuid4().int % 99999)
    term = sb.spawn(["sh"])
    # Detached three ways: a background job, a new session, an orphan (double fork).
    # (python, not sleep: busybox runs a backgrounded applet without exec, so it has no argv of its own)
    nap = "python3 -c 'import time; time.sleep(999)'"
    term.write(f"{nap} {tag}1 & setsid {nap} {tag}2 & sh -c \"{nap} {tag}3 &\"\n".encode())
    deadline = time.monotonic() + 5
    while len(host_pids_with(tag)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(host_pids_with(tag)) == 3
    sb.close()
    assert gone(lambda: host_pids_with(tag))


def test_a_sandbox_cannot_see_another_sandboxs_files(make_sandbox):
    a, b = make_sandbox(), make_sandbox()
    secret = f"secret-{uuid.uuid4().hex}"
    a.write_file(f"{secret}.txt", b"hidden")
    look = ["sh", "-c", f"find / \\( -path /proc -o -path /sys -o -path /usr \\) -prune -o -name '{secret}*' -print "
                        "2>/dev/null; true"]
    assert b.exec(look).output == b""
    if hasattr(a, "workspace"):  # bwrap: not even by the host path of a's workspace
        r = b.exec(["cat", f"{a.workspace}/{secret}.txt"])
        assert r.exit_code != 0 and b"hidden" not in r.output


# Reads every regular file under /proc (symlinked ones too, e.g. exe and fd/N when they are
# files), up to 1 MB each, and names those holding the needle. The needle comes hex-encoded,
# so it is nowhere in /proc (not in this script's own cmdline) unless something leaked it.
PROC_WALK = r"""
import os, stat, sys
needle, seen, pid1 = bytes.fromhex(sys.argv[1]), 0, False
for root, dirs, names in os.walk("/proc"):
    for name in names:
        path = os.path.join(root, name)
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):
                continue
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            try:
                data = b""
                while len(data) < 1 << 20 and (chunk := os.read(fd, 65536)):
                    data += chunk
            finally:
                os.close(fd)
        except OSError:
            continue
        seen += 1
        pid1 = pid1 or path == "/proc/1/environ"
        if needle in data:
            print("FOUND", path)
print("READ", seen, "PID1_ENVIRON", pid1)
"""


def canary(monkeypatch) -> str:
    """A secret in the environment of the process that starts sandboxes (the env worker)."""
    value = f"canary-{uuid.uuid4().hex}"
    monkeypatch.setenv(f"ROLLOUT_TEST_SECRET_{uuid.uuid4().hex[:6].upper()}", value)
    monkeypatch.setenv("HF_TOKEN", value)
    return value


def test_no_host_variable_anywhere_in_proc(make_sandbox, monkeypatch):
    secret = canary(monkeypatch)
    sb = make_sandbox(Limits(timeout_s=120, output_bytes=1 << 20))
    r = sb.exec(["python3", "-c", PROC_WALK, secret.encode().hex()])
    assert r.exit_code == 0, r.text
    *found, summary = r.text.splitlines()
    assert found == []
    _, n, _, pid1 = summary.split()
    assert int(n) > 100 and pid1 == "True", summary  # it did look, bwrap's own pid 1 included


def test_the_host_folder_sandboxes_are_started_from_is_nowhere_in_proc(make_sandbox, monkeypatch, tmp_path):
    """The env worker's working folder (a deployment's path, a user name in it) reached the
    sandbox as PWD in the environment of bwrap, its pid 1, exported by the shell that moves
    it into its memory cgroup."""
    host = tmp_path / f"deploy-{uuid.uuid4().hex}"
    host.mkdir()
    monkeypatch.chdir(host)
    sb = make_sandbox(Limits(timeout_s=120, output_bytes=1 << 20))
    r = sb.exec(["python3", "-c", PROC_WALK, host.name.encode().hex()])
    assert r.exit_code == 0, r.text
    *found, summary = r.text.splitlines()
    assert found == [] and summary.endswith("PID1_ENVIRON True"), r.text


def test_no_host_variable_anywhere_in_proc_of_a_terminal(make_sandbox, monkeypatch):
    secret = canary(monkeypatch)
    sb = make_sandbox(Limits(timeout_s=120))
    term = sb.spawn(["python3", "-c", PROC_WALK, secret.encode().hex()])
    out, deadline = b"", time.monotonic() + 300  # a bound against a hang, not a timing claim
    try:
        while time.monotonic() < deadline:
            out += term.read(5)
    except EOFError:  # the walk is over
        pass
    finally:
        term.close()
    text = out.decode().replace("\r", "")
    assert "FOUND" not in text and "PID1_ENVIRON True" in text, text[-2000:]


def test_tmp_is_size_capped(make_sandbox):
    sb = make_sandbox(Limits(tmp_mb=8, timeout_s=30))
    r = sb.exec(["sh", "-c", "dd if=/dev/zero of=/tmp/a bs=1M count=4 2>/dev/null && echo FIRST; "
                             "dd if=/dev/zero of=/tmp/b bs=1M count=16 2>/dev/null && echo WROTE; true"])
    assert "FIRST" in r.text and "WROTE" not in r.text, r.text


def test_workspace_is_size_capped(make_sandbox):
    sb = make_sandbox(Limits(disk_mb=16, memory_mb=256, timeout_s=30))
    if getattr(sb, "enforced", None) and sb.enforced.workspace_mb is None:
        pytest.skip("bwrap caps the workspace only as root (a tmpfs mounted on the host): not root here")
    r = sb.exec(["sh", "-c", "dd if=/dev/zero of=a bs=1M count=8 2>/dev/null && echo FIRST; "
                             "dd if=/dev/zero of=b bs=1M count=32 2>/dev/null && echo WROTE; true"])
    assert "FIRST" in r.text and "WROTE" not in r.text, r.text


def require_memory_cgroup(sb) -> None:
    if getattr(sb, "enforced", None) and not sb.enforced.memory.startswith("cgroup"):
        pytest.skip(f"no memory cgroup can be made on this machine: {sb.enforced.memory}")


def test_files_count_against_the_memory_limit(make_sandbox):
    # Room for 512 MB of files, but only 64 MB of memory: files in a tmpfs are memory.
    sb = make_sandbox(Limits(memory_mb=64, disk_mb=512, tmp_mb=512, timeout_s=60))
    require_memory_cgroup(sb)
    try:
        r = sb.exec(["sh", "-c", "dd if=/dev/zero of=big bs=1M count=128 2>/dev/null && echo WROTE; true"])
    except SandboxError:
        return  # the engine's OOM killer took the container's init: contained too
    assert "WROTE" not in r.text, r.text


# N children each try to hold MB; the parent counts those that still hold theirs once every
# one has either allocated or died (the OOM killer only acts while someone allocates).
HOGS = r"""
import subprocess, sys
n, mb = int(sys.argv[1]), int(sys.argv[2])
child = ("import sys; b = b'x' * (%d << 20); print('HELD', flush=True); sys.stdin.readline(); "
         "print('STILL' if b[-1:] == b'x' else 'LOST', flush=True)" % mb)
kids = [subprocess.Popen([sys.executable, "-c", child], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(n)]
held = [k.stdout.readline() == "HELD\n" for k in kids]
together = 0
for k, h in zip(kids, held):
    try:
        k.stdin.write("\n")
        k.stdin.flush()
    except OSError:
        continue
    together += k.stdout.readline() == "STILL\n"
print("TOGETHER", together)
"""


def test_processes_together_cannot_exceed_the_memory_limit(make_sandbox):
    n, mb, limit = 4, 100, 256  # each one fits; all four do not
    sb = make_sandbox(Limits(memory_mb=limit, timeout_s=120))
    require_memory_cgroup(sb)
    r = sb.exec(["python3", "-c", HOGS, str(n), str(mb)])
    assert r.exit_code == 0 and "TOGETHER" in r.text, r.text
    together = int(r.text.split("TOGETHER")[1].split()[0])
    assert 1 <= together and together * mb <= limit, r.text


def mounted(path) -> bool:
    return f" {path} " in open("/proc/self/mountinfo").read()


def test_close_frees_the_workspace():  # bwrap's: docker's goes with its container
    from env_workers.sandbox.bwrap import BwrapSandbox

    sb = BwrapSandbox()
    sb.write_file("data", b"x" * (1 << 20))
    sb.close()
    assert not mounted(sb.workspace) and not sb.workspace.exists()


# An env worker killed mid-episode: its sandbox's close() never runs.
KILLED = r"""
import os, sys
from env_workers.sandbox.bwrap import BwrapSandbox
sb = BwrapSandbox(root=sys.argv[1])
sb.write_file("data", b"x" * (1 << 20))
print(sb.workspace, flush=True)
os._exit(1)
"""


def test_a_killed_env_workers_workspace_is_freed_by_the_next():
    if os.geteuid() != 0:
        pytest.skip("only root mounts a workspace (a tmpfs) that could outlive its process")
    # Not tmp_path: sandbox uids must be able to traverse every folder above their workspace.
    base = os.path.join(tempfile.gettempdir(), f"rs-test-{uuid.uuid4().hex[:8]}")

    def run(code: str) -> str:
        p = subprocess.run([sys.executable, "-c", code, base], capture_output=True, text=True)
        assert p.returncode in (0, 1), p.stderr
        return p.stdout

    try:
        workspace = run(KILLED).strip()
        assert mounted(workspace)
        run("import sys; from env_workers.sandbox.bwrap import BwrapSandbox; BwrapSandbox(root=sys.argv[1]).close()")
        assert not mounted(workspace) and not os.path.exists(workspace)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_rollout_up_children_get_no_arbitrary_secret(monkeypatch):
    from rollout_service.up import child_env

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cret")
    monkeypatch.setenv("HF_TOKEN", "hf_s3cret")
    monkeypatch.setenv(f"SOME_{uuid.uuid4().hex[:8].upper()}", "s3cret")
    env = child_env()
    assert not any("s3cret" in v for v in env.values()), sorted(env)


def test_rollout_up_children_keep_what_they_need(monkeypatch):
    from rollout_service.up import child_env

    for name in ("ROLLOUT_LEASE_S", "VLLM_CPU_KVCACHE_SPACE", "HF_HUB_OFFLINE", "PATH"):
        monkeypatch.setenv(name, "1")
    assert {"ROLLOUT_LEASE_S", "VLLM_CPU_KVCACHE_SPACE", "HF_HUB_OFFLINE", "PATH"} <= child_env().keys()
