"""`swe`: fix a bug in a small generated Python repository; reward 1 when its tests pass.

A seed picks a package name, a few modules from a bank (each with its unittest file) and one
bug to plant in one function; the user message is the bug report, written as an issue. The
model works in a sandbox with a persistent bash session and a search/replace editor, then
writes `submit`. The sandbox is acquired (and the repository unpacked into it) on the first
tool call; a `submit` before any tool call scores 0 without one, as the bug is still there.

Scoring restores the original test files (edits to tests do not count) and runs
`python3 -m unittest` in a fresh process; reward = 1.0 if it exits 0, else 0.0. The episode
is also scored when it runs out of turns (truncated).
"""

from __future__ import annotations

import io
import random
import re
import tarfile
from typing import Any

from env_workers.env import EnvError, StepResult
from env_workers.registry import EnvSpec, register
from env_workers.sandbox.base import Limits
from env_workers.sandbox.pool import EpisodeSandbox, SandboxSpec
from wire import Message

SPEC = SandboxSpec(Limits(memory_mb=1024, processes=128, timeout_s=15.0, output_bytes=16 * 1024))
SYSTEM = (
    "You are fixing a bug in the Python repository in your working directory. Act with fenced blocks:\n"
    "```bash\n<shell commands>\n```  runs in a persistent bash session (cd and variables persist);\n"
    "```replace <path>\n<exact old text>\n=======\n<new text>\n```  replaces text that occurs exactly once in <path>.\n"
    "Run the tests with `python3 -m unittest`. When you are done, reply with the single word: submit"
)
_BLOCK = re.compile(r"```(bash|sh|replace)[ \t]*([^\n]*)\n(.*?)```", re.S)
_SUBMIT = re.compile(r"^\s*submit\s*$", re.I | re.M)
MAX_BLOCKS = 4  # tool calls run per turn; the rest are ignored (and the model told so)

# module -> (source, test source, [(function, bug: (old, new), issue text)])
_BANK: dict[str, tuple[str, str, list[tuple[str, tuple[str, str], str]]]] = {
    "stats": (
        "def mean(xs):\n    return sum(xs) / len(xs)\n\n\n"
        "def median(xs):\n    s = sorted(xs)\n    n = len(s)\n    if n % 2:\n        return s[n // 2]\n"
        "    return (s[n // 2 - 1] + s[n // 2]) / 2\n",
        "import unittest\n\nfrom {pkg}.stats import mean, median\n\n\nclass TestStats(unittest.TestCase):\n"
        "    def test_mean(self):\n        self.assertEqual(mean([2, 4]), 3.0)\n        self.assertEqual(mean([5]), 5.0)\n\n"
        "    def test_median(self):\n        self.assertEqual(median([3, 1, 2]), 2)\n"
        "        self.assertEqual(median([4, 1, 3, 2]), 2.5)\n",
        [("mean", ("sum(xs) / len(xs)", "sum(xs) / (len(xs) + 1)"), "`{pkg}.stats.mean([2, 4])` returns 1.333 instead of 3.0."),
         ("median", ("    if n % 2:\n        return s[n // 2]\n", "    return s[n // 2]\n"),
          "`{pkg}.stats.median([4, 1, 3, 2])` returns 3 instead of 2.5.")]),
    "text": (
        "def slugify(title):\n    return \"-\".join(title.lower().split())\n\n\n"
        "def word_count(s):\n    return len(s.split())\n",
        "import unittest\n\nfrom {pkg}.text import slugify, word_count\n\n\nclass TestText(unittest.TestCase):\n"
        "    def test_slugify(self):\n        self.assertEqual(slugify(\"Hello  World\"), \"hello-world\")\n\n"
        "    def test_word_count(self):\n        self.assertEqual(word_count(\"a  b c \"), 3)\n",
        [("slugify", ("title.lower().split()", "title.split()"), "`{pkg}.text.slugify(\"Hello World\")` keeps capitals."),
         ("word_count", ("s.split()", "s.split(\" \")"), "`{pkg}.text.word_count(\"a  b\")` counts 3 words, not 2.")]),
    "ranges": (
        "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n\n\n"
        "def chunks(xs, n):\n    return [xs[i:i + n] for i in range(0, len(xs), n)]\n",
        "import unittest\n\nfrom {pkg}.ranges import chunks, clamp\n\n\nclass TestRanges(unittest.TestCase):\n"
        "    def test_clamp(self):\n        self.assertEqual(clamp(5, 0, 3), 3)\n        self.assertEqual(clamp(-1, 0, 3), 0)\n"
        "        self.assertEqual(clamp(2, 0, 3), 2)\n\n"
        "    def test_chunks(self):\n        self.assertEqual(chunks([1, 2, 3, 4, 5], 2), [[1, 2], [3, 4], [5]])\n",
        [("clamp", ("max(lo, min(x, hi))", "min(lo, max(x, hi))"), "`{pkg}.ranges.clamp(2, 0, 3)` returns 0, not 2."),
         ("chunks", ("range(0, len(xs), n)", "range(0, len(xs) - n, n)"),
          "`{pkg}.ranges.chunks([1, 2, 3, 4, 5], 2)` drops the last items.")]),
    "money": (
        "def fmt_cents(c):\n    return f\"${c // 100}.{c % 100:02d}\"\n",
        "import unittest\n\nfrom {pkg}.money import fmt_cents\n\n\nclass TestMoney(unittest.TestCase):\n"
        "    def test_fmt_cents(self):\n        self.assertEqual(fmt_cents(1205), \"$12.05\")\n"
        "        self.assertEqual(fmt_cents(99), \"$0.99\")\n",
        [("fmt_cents", ("{c % 100:02d}", "{c % 100}"), "`{pkg}.money.fmt_cents(1205)` gives \"$12.5\", not \"$12.05\".")]),
}
_PKGS = ["tidylib", "numkit", "pyutils", "smallkit", "toolbelt", "handy"]


def generate(seed: int) -> dict[str, Any]:
    """{"files": {path: text}, "tests": [paths], "issue": text, "module", "function"}."""
    rng = random.Random(seed)
    pkg = rng.choice(_PKGS)
    mods = sorted(rng.sample(sorted(_BANK), 3))
    buggy = rng.choice(mods)
    fn, (old, new), issue = rng.choice(_BANK[buggy][2])
    files = {f"{pkg}/__init__.py": "", "README.md": f"# {pkg}\n\nSmall helpers. Tests: `python3 -m unittest`.\n",
             "tests/__init__.py": ""}
    for m in mods:
        src, test, _ = _BANK[m]
        files[f"{pkg}/{m}.py"] = src.replace(old, new) if m == buggy else src
        files[f"tests/test_{m}.py"] = test.format(pkg=pkg)
    return {"files": files, "tests": [p for p in files if p.startswith("tests/")], "module": f"{pkg}.{buggy}",
            "function": fn, "issue": f"Bug report: {issue.format(pkg=pkg)} Please fix it so that the tests pass."}


def _tar(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class SweEnv:
    def __init__(self, resources=None, max_turns: int = 30, tool_timeout_s: float = 10.0) -> None:
        self._resources, self.max_turns, self.tool_timeout_s = resources, max_turns, tool_timeout_s
        self._sandbox: EpisodeSandbox | None = None
        self._repo: dict[str, Any] = {}
        self._unpacked, self._done, self._turns = False, True, 0

    def reset(self, task: dict[str, Any], seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        if "seed" not in task:
            raise EnvError("a swe task needs 'seed'")
        self._repo = generate(int(task["seed"]))
        self.close()
        self._sandbox = EpisodeSandbox(SPEC, self._resources)
        self._unpacked, self._done, self._turns = False, False, 0
        return [Message(role="system", content=SYSTEM), Message(role="user", content=self._repo["issue"])], {}

    def _ensure_repo(self) -> None:
        if not self._unpacked:
            r = self._sandbox.exec(["tar", "-xzf", "-"], stdin=_tar(self._repo["files"]))
            if r.exit_code != 0:
                raise EnvError(f"could not unpack the repository: {r.text[:300]}")
            self._unpacked = True

    def step(self, action: str) -> StepResult:
        if self._done:
            raise EnvError("step() after the episode ended; call reset()")
        self._turns += 1
        blocks = _BLOCK.findall(action)
        if not blocks and _SUBMIT.search(action):
            return self._finish(truncated=False)
        if not blocks:
            if self._turns >= self.max_turns:
                return self._finish(truncated=True)
            return StepResult([Message(role="user", content="Use a ```bash or ```replace block, or reply: submit")],
                              0.0, False, False, {"turns": self._turns})
        self._ensure_repo()
        outputs, failure = [], None
        for kind, arg, body in blocks[:MAX_BLOCKS]:
            if kind == "replace":
                old, sep, new = body.partition("\n=======\n")
                r = self._sandbox.call("str_replace", path=arg.strip(), old=old,
                                       new=new.removesuffix("\n")) if sep else None
                text = r.text if r else "error: a replace block needs a line ======= between old and new text"
            else:
                r = self._sandbox.call("bash", command=body, timeout_s=self.tool_timeout_s)
                text = r.text + (f"[exit code {r.exit_code}]" if r.exit_code else "")
            failure = failure or (r.failure.value if r and r.failure else None)
            outputs.append(text)
        if len(blocks) > MAX_BLOCKS:
            outputs.append(f"[only the first {MAX_BLOCKS} blocks ran]")
        if self._turns >= self.max_turns:
            return self._finish(truncated=True, note="\n\n".join(outputs))
        return StepResult([Message(role="user", content="\n\n".join(outputs) or "(no output)")], 0.0, False, False,
                          {"turns": self._turns, "tool_failure": failure})

    def _finish(self, truncated: bool, note: str = "") -> StepResult:
        self._done = True
        if not self._unpacked:  # never touched the repository: the bug is still there
            self.close()
            return StepResult([], 0.0, not truncated, truncated, {"tests_passed": False, "turns": self._turns})
        tests = {p: self._repo["files"][p] for p in self._repo["tests"]}
        self._sandbox.exec(["sh", "-c", "rm -rf tests && tar -xzf -"], stdin=_tar(tests))
        r = self._sandbox.exec(["python3", "-m", "unittest", "-q"], timeout_s=30.0)
        self.close()
        ok = r.exit_code == 0
        text = (note + "\n\n" if note else "") + ("Tests pass." if ok else "Tests fail:\n" + r.text[-1500:])
        return StepResult([Message(role="user", content=text)], float(ok), not truncated, truncated,
                          {"tests_passed": ok, "turns": self._turns, "tool_failure": "timeout" if r.timed_out else None})

    def close(self) -> None:
        self._done = True
        if self._sandbox is not None:
            self._sandbox.release()


register(EnvSpec("swe", SweEnv, "fix a bug in a small generated repository with bash and an editor; reward = tests pass",
                 example_tasks=[{"seed": 0}, {"seed": 7}], resources=(SPEC,),
                 nondeterminism="the model's shell commands run for real in the sandbox: output that shows the "
                                "clock, process ids, random numbers or timing (date, ls -l, $RANDOM, a command "
                                "near its time limit, unittest's 'Ran N tests in 0.002s' line, which the report of "
                                "failing tests at submit shows too) differs on replay; everything else replays exactly"))
