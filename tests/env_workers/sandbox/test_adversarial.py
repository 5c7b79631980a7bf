"""Hostile code in a sandbox, one property per test, on every backend."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid

from env_workers.sandbox import Limits


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
    bomb, other = make_sandbox(Limits(processes=limit, timeout_s=2)), make_sandbox(Limits(timeout_s=5))
    seen, done = [0], threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen[0] = max(seen[0], len(host_pids(bomb)))
            time.sleep(0.05)

    w = threading.Thread(target=watch)
    w.start()
    try:
        t0 = time.monotonic()
        bomb.exec(["sh", "-c", "b() { b | b & }; b; sleep 5"])  # may end early: its own shell cannot fork
        assert time.monotonic() - t0 < 6
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
