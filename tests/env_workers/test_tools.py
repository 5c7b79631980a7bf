"""Tools in a sandbox, on every backend: state persists, failures come back as text."""

from __future__ import annotations

import signal

import pytest

from env_workers import tools
from env_workers.sandbox import Limits
from env_workers.tools import ToolFailure, Toolbox


# Every wall-clock figure in this file is a generous bound, never a margin the test needs to win:
# on a loaded machine a shell in a sandbox can take seconds to run an `echo`. A call returns as soon
# as its command does, so a large default budget costs nothing; a test that needs a timeout to
# fire runs a command that would otherwise go on for minutes.
@pytest.fixture
def box(make_sandbox):
    tb = Toolbox(make_sandbox(Limits(timeout_s=60.0, output_bytes=4096)))
    yield tb
    tb.close()


def test_bash_keeps_cwd_and_variables_between_calls(box):
    assert box.call("bash", command="mkdir -p src && cd src && export X=41 && f() { echo $((X + 1)); }").exit_code == 0
    r = box.call("bash", command="pwd; f")
    assert r.text == "/workspace/src\n42\n" and r.failure is None


def test_bash_reports_exit_code_without_calling_it_a_failure(box):
    r = box.call("bash", command="echo no >&2; false")
    assert r.exit_code == 1 and r.failure is None and "no" in r.text


def test_bash_runs_on_a_terminal(box):
    assert box.call("bash", command="[ -t 1 ] && echo tty").text == "tty\n"


def test_bash_takes_commands_longer_than_a_terminal_line(box):
    r = box.call("bash", command="echo " + "x" * 10_000 + " | wc -c")
    assert r.text.strip() == "10001"


def test_bash_timeout_interrupts_a_shell_started_while_sigint_was_ignored(box, monkeypatch):
    """Ignored and blocked signals survive exec: a shell started while this process had SIGINT
    ignored and blocked (any library may do so for a moment) never saw ^C, and every timeout
    restarted it (the full suite's flaky `test_bash_timeout_interrupts_and_keeps_the_session`)."""
    monkeypatch.setattr(tools, "INTERRUPT_GRACE_S", 60.0)
    old, mask = signal.signal(signal.SIGINT, signal.SIG_IGN), signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        box.call("bash", command="Y=kept")  # the shell starts here
    finally:
        signal.signal(signal.SIGINT, old)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    r = box.call("bash", command="echo before; sleep 600", timeout_s=2)
    assert "interrupted with ^C" in r.text and "restarted" not in r.text
    assert box.call("bash", command="echo $Y").text == "kept\n"


def test_bash_timeout_interrupts_and_keeps_the_session(box, monkeypatch):
    # The grace only bounds how long an interrupted shell may take to answer ^C; it returns as
    # soon as the shell does, so a long one proves the same and cannot lose a race under load.
    monkeypatch.setattr(tools, "INTERRUPT_GRACE_S", 60.0)
    box.call("bash", command="cd /tmp && Y=kept")
    r = box.call("bash", command="echo before; sleep 600; echo slept-through", timeout_s=5)
    assert r.failure is ToolFailure.timeout and "interrupted with ^C" in r.text and "restarted" not in r.text
    assert "before" in r.text and "slept-through" not in r.text  # the output so far; the rest never ran
    assert r.duration_s < 300  # interrupted, not waited out
    assert box.call("bash", command="echo $Y $(pwd)").text == "kept /tmp\n"
    # again: a marker the shell was asked for twice never leaks into later output
    assert "interrupted" in box.call("bash", command="sleep 600", timeout_s=2).text
    assert box.call("bash", command="echo $Y").text == "kept\n"


def test_bash_that_ignores_interrupt_is_restarted(box, monkeypatch):
    # A shell that ignores ^C (and its `sleep`, which inherits that) never answers, however long
    # the grace: a short one only saves time. The budget is what must be generous: a ^C that lands
    # before `trap` has run is answered, and the shell is (rightly) not restarted.
    monkeypatch.setattr(tools, "INTERRUPT_GRACE_S", 0.5)
    r = box.call("bash", command="trap '' INT; sleep 600", timeout_s=5)
    assert r.failure is ToolFailure.timeout and "restarted" in r.text
    assert box.call("bash", command="echo fresh").text == "fresh\n"


def test_bash_exit_is_a_crash_and_the_next_call_starts_fresh(box):
    box.call("bash", command="cd /tmp")
    r = box.call("bash", command="exit 3")
    assert r.failure is ToolFailure.crash and "exited" in r.text
    assert box.call("bash", command="pwd").text == "/workspace\n"


def test_bash_output_is_capped(box):
    r = box.call("bash", command="yes | head -c 100000")
    assert r.truncated and len(r.text) < 5000 and "dropped" in r.text
    assert box.call("bash", command="echo next").text == "next\n"


def test_python_keeps_globals_and_echoes_the_last_expression(box):
    assert box.call("python", code="import math\nx = 6 * 7").text == ""
    assert box.call("python", code="print('p'); math.sqrt(x * x)").text == "p\n42.0\n"


def test_python_exception_is_a_traceback_not_a_failure(box):
    r = box.call("python", code="def f():\n    return 1 / 0\nf()")
    assert r.failure is None and r.exit_code == 1
    assert "ZeroDivisionError" in r.text and "<cell>" in r.text and "<string>" not in r.text


def test_python_timeout_restarts_the_interpreter(box):
    box.call("python", code="y = 1")
    r = box.call("python", code="while True: pass", timeout_s=0.5)
    assert r.failure is ToolFailure.timeout and "restarted" in r.text
    assert "NameError" in box.call("python", code="y").text


def test_python_crash_is_classified(box):
    r = box.call("python", code="import os; os._exit(9)")
    assert r.failure is ToolFailure.crash
    assert box.call("python", code="1 + 1").text == "2\n"


def test_python_captures_subprocess_output(box):
    assert box.call("python", code="import os; os.system('echo from-child')").text == "from-child\n0\n"


def test_file_create_view_replace_insert(box):
    assert box.call("create", path="pkg/a.py", text="a = 1\nb = 2\n").failure is None
    assert box.call("str_replace", path="pkg/a.py", old="b = 2", new="b = 3").text == "edited pkg/a.py"
    box.call("insert", path="pkg/a.py", line=0, text="# head")
    assert box.call("view", path="pkg/a.py").text == "     1\t# head\n     2\ta = 1\n     3\tb = 3"
    assert box.call("bash", command="python3 -c 'import pkg.a as m; print(m.b)'").text == "3\n"


def test_file_errors_are_text(box):
    box.call("create", path="a.txt", text="x x\n")
    assert "exactly once" in box.call("str_replace", path="a.txt", old="x", new="y").text
    r = box.call("view", path="missing.txt")
    assert r.exit_code == 1 and r.failure is None and "No such file" in r.text


def test_file_tools_cannot_follow_a_symlink_out_of_the_sandbox(box, tmp_path):
    secret = tmp_path / "host-secret.txt"
    secret.write_text("host only")
    box.call("bash", command=f"ln -s {secret} link.txt")
    assert "host only" not in box.call("view", path="link.txt").text
    box.call("create", path="link.txt", text="overwritten")
    assert secret.read_text() == "host only"


def test_unknown_tool_and_missing_argument_are_text(box):
    assert "unknown tool" in box.call("rm_rf").text
    assert "needs the argument 'command'" in box.call("bash").text
