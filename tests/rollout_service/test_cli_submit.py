"""`rollout submit` with a tasks file the SDK refuses: one line a problem, by its line in the file."""

from __future__ import annotations

import subprocess
import sys


def test_a_tasks_file_the_sdk_refuses_names_each_bad_line_and_sends_nothing(tmp_path):
    """A task holding NaN (which Python's parser reads) or a line that is JSON but not an object
    ended `rollout submit` in a pydantic traceback. Nothing is sent: the URL here answers nothing."""
    f = tmp_path / "math.jsonl"
    f.write_text('{"seed": 1}\n\n{"seed": NaN}\n[1, 2]\n{"seed": 4}\n')
    out = subprocess.run([sys.executable, "-m", "rollout_service.cli", "submit", str(f), "--url", "http://127.0.0.1:9"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.splitlines() == [
        "invalid batch:",
        f"  {f}:3: $.seed is nan: JSON has no NaN or Infinity (send a string or null)",
        f"  {f}:4: Input should be a valid dictionary"]
    out = subprocess.run([sys.executable, "-m", "rollout_service.cli", "submit", str(f), "--group-size", "0",
                          "--url", "http://127.0.0.1:9"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "group_size: Input should be greater than or equal to 1" in out.stderr
