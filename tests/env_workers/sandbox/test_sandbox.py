"""The sandbox protocol, on every backend."""

import hashlib

from env_workers.sandbox import WORKSPACE, Limits


def test_exec_returns_output_and_exit_code(sandbox):
    r = sandbox.exec(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert r.exit_code == 3 and b"out\n" in r.output and b"err\n" in r.output and not r.timed_out


def test_exec_feeds_stdin_then_its_end(sandbox):
    data = bytes(range(256)) * 512  # binary, and more than one socket/pipe buffer
    r = sandbox.exec(["sh", "-c", "cat > got && wc -c < got && sha256sum got"], stdin=data)
    assert r.exit_code == 0 and r.output.split()[0] == str(len(data)).encode()
    assert hashlib.sha256(data).hexdigest().encode() in r.output


def test_exec_starts_in_the_writable_workspace(sandbox):
    r = sandbox.exec(["sh", "-c", "pwd && echo x > f && cat f"])
    assert r.text == f"{WORKSPACE}\nx\n"


def test_exec_timeout_kills_and_says_so(sandbox):
    r = sandbox.exec(["sleep", "30"], timeout_s=0.5)
    assert r.timed_out and r.exit_code is None and r.duration_s < 5


def test_exec_output_is_capped(make_sandbox):
    sb = make_sandbox(Limits(output_bytes=1000, timeout_s=5))
    r = sb.exec(["yes"])
    assert r.truncated and len(r.output) == 1000 and r.duration_s < 5


def test_files_round_trip_in_subfolders(sandbox):
    sandbox.write_file("a/b/c.txt", b"hello\x00world")
    assert sandbox.read_file("a/b/c.txt") == b"hello\x00world"
    assert sandbox.exec(["cat", f"{WORKSPACE}/a/b/c.txt"]).output == b"hello\x00world"


def test_each_sandbox_starts_with_an_empty_workspace(make_sandbox):
    a, b = make_sandbox(), make_sandbox()
    a.write_file("mine", b"1")
    assert b.exec(["ls", "-A"]).output == b""


def test_environment_holds_no_host_secrets(sandbox, monkeypatch):
    monkeypatch.setenv("ROLLOUT_SECRET_TOKEN", "s3cret")
    assert b"s3cret" not in sandbox.exec(["env"]).output


def test_a_closed_sandbox_refuses_work(sandbox):
    import pytest

    from env_workers.sandbox import SandboxClosed

    sandbox.close()
    with pytest.raises(SandboxClosed):
        sandbox.exec(["true"])
