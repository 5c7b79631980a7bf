"""`code`: write a Python function; reward = the fraction of its unit tests that pass.

The model answers with one ```python fenced block defining the function. The block and the
test cases go into a sandbox (acquired only then, through the episode's resource claims)
and run in one `python3 -I` process: loading the code may take 2 s, each case 1 s and all
cases together 4 s (an infinite loop fails its case, not the run); the process as a whole
has the sandbox's wall-clock limit. Expected values are
computed on the host by a reference implementation and never enter the sandbox; the sandbox
returns only what the function gave back, after a per-run nonce.

Problems are generated from a seed (a bank of function templates, random parameters and
random test inputs) or given explicitly: `{"prompt", "entry_point", "tests": [{"args", "expected"}]}`.
Non-goal: resisting code that digs the nonce out of the harness's frames to forge results.
"""

from __future__ import annotations

import json
import random
import re
import uuid
from typing import Any

from env_workers.env import EnvError, StepResult
from env_workers.registry import EnvSpec, register
from env_workers.sandbox.base import Limits
from env_workers.sandbox.pool import EpisodeSandbox, SandboxSpec
from wire import Message

SPEC = SandboxSpec(Limits(memory_mb=512, processes=64, cpu_s=30, timeout_s=20.0), warm_bash=False)
SYSTEM = ("Write the Python function described by the user. Reply with exactly one fenced code block:\n"
          "```python\ndef name(...):\n    ...\n```\nOnly the standard library is available. The function is "
          "tested once, on hidden unit tests; your reward is the fraction that pass.")
_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.S)
_HARNESS = r"""
import copy, json, signal, sys
req = json.loads(sys.stdin.read())
nonce = req.pop("nonce")
class CaseTimeout(Exception):
    pass
def alarm(*_):
    raise CaseTimeout("took too long")
signal.signal(signal.SIGALRM, alarm)
out = []
try:
    signal.setitimer(signal.ITIMER_REAL, 2.0)
    ns = {"__name__": "solution"}
    exec(compile(req["code"], "solution.py", "exec"), ns)
    signal.setitimer(signal.ITIMER_REAL, 0)
    fn = ns[req["entry"]]
except BaseException as e:
    print(nonce + json.dumps({"error": "%s: %s" % (type(e).__name__, e)}))
    sys.exit(0)
import time
deadline = time.monotonic() + 4.0
for args in req["cases"]:
    left = min(1.0, deadline - time.monotonic())
    if left <= 0:
        out.append({"error": "not run: the tests' time budget was spent"})
        continue
    signal.setitimer(signal.ITIMER_REAL, left)
    try:
        got = {"ok": json.loads(json.dumps(fn(*copy.deepcopy(args))))}
    except BaseException as e:
        got = {"error": "%s: %s" % (type(e).__name__, e)}
    signal.setitimer(signal.ITIMER_REAL, 0)
    out.append(got)
sys.stdout.flush()
print("\n" + nonce + json.dumps({"results": out}))
"""


def _problems() -> list:
    def ints(rng, n=8, lo=-20, hi=20):
        return [rng.randint(lo, hi) for _ in range(rng.randint(0, n))]

    def words(rng):
        return "".join(rng.choice("abcdeiouxyz AEIOU,!") for _ in range(rng.randint(0, 20)))

    return [
        ("count_vowels", "count_vowels(s: str) -> int", "the number of vowels (a, e, i, o, u, any case) in s",
         lambda p: lambda s: sum(c in "aeiouAEIOU" for c in s), lambda rng, p: [words(rng)]),
        ("running_max", "running_max(xs: list[int]) -> list[int]", "the list of prefix maxima of xs",
         lambda p: lambda xs: [max(xs[:i + 1]) for i in range(len(xs))], lambda rng, p: [ints(rng)]),
        ("sum_multiples", "sum_multiples(n: int) -> int", "the sum of the integers in [1, n) divisible by {a} or {b}",
         lambda p: lambda n: sum(x for x in range(1, n) if x % p["a"] == 0 or x % p["b"] == 0),
         lambda rng, p: [rng.randint(0, 200)]),
        ("rotate", "rotate(xs: list[int], k: int) -> list[int]", "xs rotated right by k places (k >= 0 may exceed len)",
         lambda p: lambda xs, k: xs[-(k % len(xs)):] + xs[:-(k % len(xs))] if xs else [],
         lambda rng, p: [ints(rng), rng.randint(0, 12)]),
        ("is_palindrome", "is_palindrome(s: str) -> bool",
         "whether s reads the same backwards, ignoring case and every non-alphanumeric character",
         lambda p: lambda s: [c.lower() for c in s if c.isalnum()] == [c.lower() for c in s if c.isalnum()][::-1],
         lambda rng, p: [rng.choice([words(rng), "A man, a plan, a canal: Panama", "abba", "ab"])]),
        ("dedupe", "dedupe(xs: list[int]) -> list[int]", "xs without repeated values, keeping first occurrences in order",
         lambda p: lambda xs: list(dict.fromkeys(xs)), lambda rng, p: [ints(rng, 10, 0, 5)]),
        ("shift_letters", "shift_letters(s: str) -> str",
         "s with every ASCII letter moved {k} places forward in the alphabet (wrapping, keeping case); "
         "other characters unchanged",
         lambda p: lambda s: "".join(chr((ord(c) - b + p["k"]) % 26 + b) if c.isascii() and c.isalpha() else c
                                     for c in s for b in [ord("a") if c.islower() else ord("A")]),
         lambda rng, p: [words(rng)]),
        ("second_largest", "second_largest(xs: list[int]) -> int | None",
         "the second largest distinct value in xs, or None if there is none",
         lambda p: lambda xs: sorted(set(xs))[-2] if len(set(xs)) > 1 else None, lambda rng, p: [ints(rng, 6, 0, 9)]),
    ]


def generate(seed: int, n_tests: int = 8) -> dict[str, Any]:
    rng = random.Random(seed)
    name, sig, desc, ref, gen = rng.choice(_problems())
    params = {"a": rng.choice([2, 3]), "b": rng.choice([5, 7]), "k": rng.randint(1, 25)}
    fn = ref(params)
    tests = []
    for _ in range(n_tests):
        args = gen(rng, params)
        tests.append({"args": args, "expected": fn(*args)})
    return {"prompt": f"Write `def {sig}` that returns {desc.format(**params)}.", "entry_point": name, "tests": tests}


class CodeEnv:
    def __init__(self, resources=None, max_turns: int = 3) -> None:
        self._resources, self.max_turns = resources, max_turns
        self._sandbox: EpisodeSandbox | None = None
        self._done, self._turns = True, 0
        self._problem: dict[str, Any] = {}

    def reset(self, task: dict[str, Any], seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        if "seed" in task:
            self._problem = generate(int(task["seed"]))
        elif {"prompt", "entry_point", "tests"} <= task.keys() and task["tests"]:
            self._problem = {k: task[k] for k in ("prompt", "entry_point", "tests")}
        else:
            raise EnvError("a code task needs 'seed', or 'prompt', 'entry_point' and non-empty 'tests'")
        self._close_sandbox()
        self._sandbox = EpisodeSandbox(SPEC, self._resources)
        self._done, self._turns = False, 0
        return [Message(role="system", content=SYSTEM), Message(role="user", content=self._problem["prompt"])], {}

    def step(self, action: str) -> StepResult:
        if self._done:
            raise EnvError("step() after the episode ended; call reset()")
        self._turns += 1
        blocks = _BLOCK.findall(action)
        if not blocks:
            self._done = self._turns >= self.max_turns
            if self._done:
                self._close_sandbox()
            return StepResult([Message(role="user", content="No code found. Reply with one ```python fenced block.")],
                              0.0, False, self._done, {"turns": self._turns})
        passed, total, text, info = self.run_tests(blocks[-1])
        self._done = True
        self._close_sandbox()
        return StepResult([Message(role="user", content=text)], passed / total, True, False,
                          info | {"passed": passed, "total": total})

    def run_tests(self, code: str) -> tuple[int, int, str, dict[str, Any]]:
        tests, nonce = self._problem["tests"], f"@@{uuid.uuid4().hex}@@"
        req = {"nonce": nonce, "code": code, "entry": self._problem["entry_point"], "cases": [t["args"] for t in tests]}
        r = self._sandbox.exec(["python3", "-I", "-c", _HARNESS], stdin=json.dumps(req).encode())
        info = {"tool_failure": "timeout" if r.timed_out else None, "exit_code": r.exit_code,
                "tool_s": round(r.duration_s, 4)}
        line = next((ln for ln in reversed(r.text.splitlines()) if ln.startswith(nonce)), None)
        if line is None:
            if not r.timed_out:
                info["tool_failure"] = "crash"
            return 0, len(tests), f"The tests could not run: {r.text[-500:] or 'no output'}", info
        got = json.loads(line[len(nonce):])
        if "error" in got:
            return 0, len(tests), f"Your code failed to load: {got['error']}", info
        # Compared as JSON text: True is not 1, 2.0 is not 2.
        passed = sum("ok" in g and json.dumps(g["ok"]) == json.dumps(t["expected"])
                     for g, t in zip(got["results"], tests))
        return passed, len(tests), f"{passed}/{len(tests)} tests passed.", info

    def _close_sandbox(self) -> None:
        if self._sandbox is not None:
            self._sandbox.release()

    def close(self) -> None:
        self._done = True
        self._close_sandbox()


register(EnvSpec("code", CodeEnv, "write a Python function; reward = fraction of unit tests passed (in a sandbox)",
                 example_tasks=[{"seed": 0}, {"prompt": "Write `def add(a: int, b: int) -> int`.", "entry_point": "add",
                                              "tests": [{"args": [1, 2], "expected": 3}, {"args": [0, 0], "expected": 0}]}],
                 resources=(SPEC,),
                 nondeterminism="the model's code runs for real in the sandbox: code that reads the clock or "
                                "randomness, or runs near its time limits (1 s a case, 4 s in all), can pass on one run "
                                "and fail on another; other code replays exactly"))
