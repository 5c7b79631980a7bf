"""Tools an agent uses inside a sandbox: a bash session, a python interpreter, a file editor.

    tools = Toolbox(sandbox)
    tools.call("bash", command="cd src && export X=1")
    tools.call("bash", command="pwd; echo $X")          # ToolResult(text="/workspace/src\\n1\\n", ...)
    tools.call("python", code="x = 6 * 7\\nx")            # ToolResult(text="42\\n", ...)
    tools.call("view", path="src/a.py")                  # numbered lines
    tools.call("str_replace", path="src/a.py", old="1", new="2")

Every call has a timeout and returns a `ToolResult`, never raises and never hangs: output
and errors go back to the model as text, and a call that timed out, crashed its shell or
interpreter, or found the sandbox broken also carries a `ToolFailure` for the trajectory
(`result.info()` goes into `StepResult.info`). A non-zero exit code is not a failure: it is
ordinary feedback for the model.

The bash session runs on a pseudo-terminal, so `cd`, variables and functions persist, and
programs see a terminal. A timed-out command gets ^C; if the shell does not come back, it is
restarted (state lost, and the text says so). The python interpreter keeps its globals
between calls and echoes the value of a trailing expression; a timeout restarts it.

Non-goals: parsing tool calls out of model text (the environment does that), and choosing
or reusing sandboxes (`env_workers/resources.py`).
"""

from __future__ import annotations

import base64
import json
import re
import time
import uuid
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from env_workers.sandbox.base import Sandbox, SandboxError, Terminal

BASH = ("bash", "--noprofile", "--norc", "--noediting", "-i")  # -i: job control, so ^C works
INTERRUPT_GRACE_S = 2.0  # after ^C, how long the shell has to come back before a restart
START_TIMEOUT_S = 10.0


class ToolFailure(str, Enum):
    timeout = "timeout"    # the call ran past its limit and was interrupted
    crash = "crash"        # the shell or interpreter died; it restarts on the next call
    sandbox = "sandbox"    # the sandbox itself failed: infrastructure, not the model's doing


@dataclass(slots=True)
class ToolResult:
    text: str
    failure: ToolFailure | None = None
    exit_code: int | None = None
    truncated: bool = False
    duration_s: float = 0.0

    def info(self) -> dict[str, Any]:
        return {"tool_failure": self.failure.value if self.failure else None, "exit_code": self.exit_code,
                "truncated": self.truncated, "tool_s": round(self.duration_s, 4)}


@dataclass(slots=True)
class _Reader:
    """Reads a terminal until a marker regex matches, keeping at most `cap` bytes of output
    (a command printing forever costs us nothing but the time limit)."""

    term: Terminal
    marker: re.Pattern[bytes]
    cap: int
    head: bytearray = field(default_factory=bytearray)
    window: bytes = b""
    dropped: int = 0

    def until(self, deadline: float) -> re.Match[bytes] | None:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            chunk = self.term.read(min(left, 0.5))  # EOFError propagates: the process died
            if not chunk:
                continue
            buf = self.window + chunk
            m = self.marker.search(buf)
            body = buf[: m.start()] if m else buf[: max(len(buf) - 256, 0)]  # keep a tail to match across reads
            self._keep(body)
            self.window = buf[m.end():] if m else buf[len(body):]
            if m:
                return m

    def _keep(self, data: bytes) -> None:
        room = self.cap - len(self.head)
        self.head += data[:room]
        self.dropped += max(len(data) - room, 0)

    def flush(self) -> None:
        self._keep(self.window)
        self.window = b""

    def take(self) -> tuple[str, bool]:
        text, dropped = self.head.decode("utf-8", "replace"), self.dropped
        if dropped:
            text += f"\n[... {dropped} more bytes of output dropped]"
        self.head, self.dropped = bytearray(), 0
        return text, dropped > 0


class _Session:
    """A tool living in one terminal process of the sandbox; closing kills it."""

    _term = None

    def _kill(self) -> None:
        if self._term is not None:
            self._term.close()
            self._term = None

    def close(self) -> None:
        self._kill()


class BashSession(_Session):
    """A persistent bash on a pty inside the sandbox."""

    def __init__(self, sandbox: Sandbox, shell: tuple[str, ...] = BASH, timeout_s: float | None = None) -> None:
        self.sandbox, self.shell = sandbox, shell
        self.timeout_s = timeout_s or sandbox.limits.timeout_s
        self._term: Terminal | None = None
        self._tag = uuid.uuid4().hex[:12].encode()
        self._done = re.compile(rb"\n__RS_" + self._tag + rb"_(\d+)__\n")
        self._intr = re.compile(rb"\n__RS_" + self._tag + rb"_INT\d+__\n")  # any interrupt's marker
        self._interrupts = 0

    def _start(self) -> Terminal:
        term = self.sandbox.spawn(list(self.shell))
        # Before this line takes effect the terminal echoes; the reader discards all of it.
        term.write(b"stty -echo -onlcr -icanon 2>/dev/null; PS1=''; PS2=''; unset PROMPT_COMMAND; "
                   b"printf '\\n__RS_%s_%s__\\n' " + self._tag + b" 0\n")
        if _Reader(term, self._done, 0).until(time.monotonic() + START_TIMEOUT_S) is None:
            term.close()
            raise SandboxError("bash did not start")
        return term

    def run(self, command: str, timeout_s: float | None = None) -> ToolResult:
        t0 = time.monotonic()
        try:
            if self._term is None:
                self._term = self._start()
        except (SandboxError, EOFError, OSError) as e:
            return ToolResult(f"error: the sandbox could not start bash: {e}", ToolFailure.sandbox)
        term = self._term
        b64 = base64.b64encode(command.encode()).decode()
        # eval in this shell (not a subshell) so that cd and variables persist; -icanon above
        # lifts the terminal's 4 KiB line limit, so long commands go in one line.
        line = f"eval \"$(printf %s {b64} | base64 -d)\"; printf '\\n__RS_%s_%s__\\n' {self._tag.decode()} $?\n"
        reader = _Reader(term, self._done, self.sandbox.limits.output_bytes)
        try:
            term.write(line.encode())
            m = reader.until(t0 + (timeout_s or self.timeout_s))
            if m is not None:
                text, cut = reader.take()
                text = self._intr.sub(b"\n", text.encode()).decode("utf-8", "replace")  # (see _interrupt)
                return ToolResult(text, None, int(m.group(1)), cut, time.monotonic() - t0)
            return self._interrupt(reader, t0, timeout_s or self.timeout_s)
        except EOFError:
            self._kill()
            reader.flush()
            text, cut = reader.take()
            return ToolResult(text + "\n[bash exited; a new session starts on the next call, with its state reset]",
                              ToolFailure.crash, None, cut, time.monotonic() - t0)

    def _interrupt(self, reader: _Reader, t0: float, limit: float) -> ToolResult:
        term = self._term
        self._interrupts += 1  # this interrupt's own marker: a late one from an earlier cannot answer it
        n = self._interrupts
        reader.marker = re.compile(rb"\n__RS_" + self._tag + b"_INT%d__\n" % n)
        ask = f"printf '\\n__RS_%s_INT%d__\\n' {self._tag.decode()} {n}\n".encode()
        note = f"\n[timed out after {limit:g}s; interrupted with ^C]"
        # ^C, then ask the shell for a marker; both again every second until it answers. On a
        # loaded machine one ^C can miss: it may reach the line discipline late, its input flush
        # then swallowing a line already sent, or land before bash has made a just-forked job the
        # terminal's foreground group (bash takes the SIGINT and the job runs on: seen twice in
        # full runs beside stress-ng). A ^C at an idle shell only clears its input line, so
        # repeating it is harmless. A marker asked for twice shows up later as output; `run`
        # strips it.
        deadline, answered = time.monotonic() + INTERRUPT_GRACE_S, None
        while answered is None and time.monotonic() < deadline:
            term.write(b"\x03")
            time.sleep(0.05)  # let the ^C land before the next line, or the job may read it
            term.write(ask)
            answered = reader.until(min(deadline, time.monotonic() + 1.0))
        if answered is None:
            self._kill()
            reader.flush()  # keep what the command printed before it hung
            note = f"\n[timed out after {limit:g}s; the shell did not respond and was restarted: cwd and variables were reset]"
        text, cut = reader.take()
        # The original command's marker may have slipped into the output; it is not the model's.
        text = self._intr.sub(b"\n", self._done.sub(b"\n", text.encode())).decode("utf-8", "replace").rstrip("\n")
        return ToolResult(text + note, ToolFailure.timeout, None, cut, time.monotonic() - t0)


# The interpreter's side: raw terminal (no echo, no line limit), one base64 line per request,
# one marked JSON line per reply on a private copy of the terminal. The cell's own stdout
# and stderr (subprocesses included) go to a file, so they can never corrupt the framing.
_DRIVER = r"""
import ast, base64, json, os, sys, traceback, tty
if os.isatty(0):
    tty.setraw(0)
req = os.fdopen(os.dup(0), "rb", buffering=0)
reply = os.dup(1)
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
TAG, CAP, OUT = sys.argv[1].encode(), int(sys.argv[2]), "/tmp/.rs_python_%s" % sys.argv[1]
ns = {"__name__": "__main__"}
def cell(code):
    tree = ast.parse(code, "<cell>", "exec")
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "<cell>", "exec"), ns)
    if last is not None:
        v = eval(compile(ast.Expression(last.value), "<cell>", "eval"), ns)
        if v is not None:
            print(repr(v))
def line():
    b = bytearray()
    while not b.endswith(b"\n"):
        c = req.read(1)
        if not c:
            sys.exit(0)
        b += c
    return bytes(b)
os.write(reply, b"\n__RS_" + TAG + b"__{}\n")
while True:
    code = base64.b64decode(line()).decode()
    with open(OUT, "w+b") as f:
        os.dup2(f.fileno(), 1); os.dup2(f.fileno(), 2)
        ok = True
        try:
            cell(code)
        except BaseException as e:
            ok, tb = False, e.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename != "<cell>":
                tb = tb.tb_next  # hide the driver's own frames from the model
            traceback.print_exception(type(e), e, tb)
        sys.stdout.flush(); sys.stderr.flush()
        size = f.tell(); f.seek(0); out = f.read(CAP)
    os.write(reply, b"\n__RS_" + TAG + b"__" + json.dumps({"ok": ok, "out": out.decode("utf-8", "replace"),
             "size": size}).encode() + b"\n")
"""


class PythonSession(_Session):
    """A persistent python interpreter inside the sandbox (its own `python3`)."""

    def __init__(self, sandbox: Sandbox, python: str = "python3", timeout_s: float | None = None) -> None:
        self.sandbox, self.python = sandbox, python
        self.timeout_s = timeout_s or sandbox.limits.timeout_s
        self._term: Terminal | None = None
        self._tag = uuid.uuid4().hex[:12]
        self._reply = re.compile(rb"\n__RS_" + self._tag.encode() + rb"__(\{.*?\})\n", re.S)

    def _reader(self, term: Terminal) -> _Reader:
        # Replies are one JSON line, already capped by the driver; allow for its escaping.
        return _Reader(term, self._reply, 8 * self.sandbox.limits.output_bytes + 4096)

    def run(self, code: str, timeout_s: float | None = None) -> ToolResult:
        t0 = time.monotonic()
        cap = self.sandbox.limits.output_bytes
        try:
            if self._term is None:
                term = self.sandbox.spawn([self.python, "-u", "-c", _DRIVER, self._tag, str(cap)])
                if self._reader(term).until(time.monotonic() + START_TIMEOUT_S) is None:
                    term.close()
                    raise SandboxError("python did not start")
                self._term = term
        except (SandboxError, EOFError, OSError) as e:
            return ToolResult(f"error: the sandbox could not start python: {e}", ToolFailure.sandbox)
        limit = timeout_s or self.timeout_s
        reader = self._reader(self._term)
        try:
            self._term.write(base64.b64encode(code.encode()) + b"\n")
            m = reader.until(t0 + limit)
        except EOFError:
            self._kill()
            return ToolResult("[python exited or crashed; a fresh interpreter starts on the next call, "
                              "its variables are gone]", ToolFailure.crash, None, False, time.monotonic() - t0)
        if m is None:
            self._kill()
            return ToolResult(f"[timed out after {limit:g}s; the interpreter was restarted and its variables are gone]",
                              ToolFailure.timeout, None, False, time.monotonic() - t0)
        r = json.loads(m.group(1))
        text, cut = r["out"], r["size"] > cap
        if cut:
            text += f"\n[... {r['size'] - cap} more bytes of output dropped]"
        return ToolResult(text, None, 0 if r["ok"] else 1, cut, time.monotonic() - t0)


class FileEditor:
    """View and edit files in the workspace, through the sandbox (never the host's paths)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    def view(self, path: str, start: int = 1, end: int | None = None) -> ToolResult:
        data = self.sandbox.read_file(path)
        lines = data.decode("utf-8", "replace").splitlines()
        end = len(lines) if end is None else min(end, len(lines))
        body = "\n".join(f"{i:6}\t{lines[i - 1]}" for i in range(max(start, 1), end + 1))
        cap = self.sandbox.limits.output_bytes
        cut = len(body) > cap
        return ToolResult(body[:cap] + ("\n[... truncated; view a smaller range]" if cut else ""), truncated=cut)

    def create(self, path: str, text: str) -> ToolResult:
        self.sandbox.write_file(path, text.encode())
        return ToolResult(f"wrote {len(text.encode())} bytes to {path}")

    def str_replace(self, path: str, old: str, new: str) -> ToolResult:
        text = self.sandbox.read_file(path).decode("utf-8", "replace")
        n = text.count(old) if old else 0
        if n != 1:
            return ToolResult(f"error: the text to replace occurs {n} times in {path}; it must occur exactly once",
                              exit_code=1)
        self.sandbox.write_file(path, text.replace(old, new).encode())
        return ToolResult(f"edited {path}")

    def insert(self, path: str, line: int, text: str) -> ToolResult:
        lines = self.sandbox.read_file(path).decode("utf-8", "replace").splitlines(keepends=True)
        if not 0 <= line <= len(lines):
            return ToolResult(f"error: line must be between 0 and {len(lines)}", exit_code=1)
        lines.insert(line, text if text.endswith("\n") else text + "\n")
        self.sandbox.write_file(path, "".join(lines).encode())
        return ToolResult(f"inserted {text.count(chr(10)) + 1} line(s) after line {line} of {path}")


class Toolbox:
    """The tools of one sandbox, by name. `call` never raises."""

    NAMES = ("bash", "python", "view", "create", "str_replace", "insert")

    def __init__(self, sandbox: Sandbox, timeout_s: float | None = None) -> None:
        self.sandbox = sandbox
        self.bash = BashSession(sandbox, timeout_s=timeout_s)
        self.python = PythonSession(sandbox, timeout_s=timeout_s)
        self.files = FileEditor(sandbox)

    def call(self, name: str, **args: Any) -> ToolResult:
        t0 = time.monotonic()
        try:
            match name:
                case "bash":
                    r = self.bash.run(args["command"], args.get("timeout_s"))
                case "python":
                    r = self.python.run(args["code"], args.get("timeout_s"))
                case "view":
                    r = self.files.view(args["path"], int(args.get("start", 1)), args.get("end"))
                case "create":
                    r = self.files.create(args["path"], args["text"])
                case "str_replace":
                    r = self.files.str_replace(args["path"], args["old"], args["new"])
                case "insert":
                    r = self.files.insert(args["path"], int(args["line"]), args["text"])
                case _:
                    return ToolResult(f"error: unknown tool {name!r}; tools: {', '.join(self.NAMES)}", exit_code=1)
        except KeyError as e:
            return ToolResult(f"error: tool {name!r} needs the argument {e.args[0]!r}", exit_code=1)
        except SandboxError as e:
            return ToolResult(f"error: the sandbox failed: {e}", ToolFailure.sandbox, duration_s=time.monotonic() - t0)
        except OSError as e:  # a missing file, a bad path: the model's mistake, told as text
            return ToolResult(f"error: {e}", exit_code=1, duration_s=time.monotonic() - t0)
        r.duration_s = r.duration_s or time.monotonic() - t0
        return r

    def close(self) -> None:
        self.bash.close()
        self.python.close()
