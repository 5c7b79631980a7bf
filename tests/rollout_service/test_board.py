"""The trajectory board in a real headless Chromium, against a live gateway and worker.

Chromium is driven over the W3C WebDriver protocol: Debian's `chromedriver` speaks it over
HTTP, and httpx (already a dependency) is the client, so nothing is downloaded at test time
and no browser-automation package is needed. The page is opened while a batch waits in the
queue; the worker starts only then, so the test sees the progress move live to complete.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from rollout_service.config import Settings
from rollout_service.engines.sim import SimEngine
from tests.conftest import REDIS_URL, RunningWorker, free_port
from tests.rollout_service.test_worker import always_calc

ADMIN_KEY = "board-test-admin-key"
APT = "apt-get install -y --no-install-recommends chromium chromium-driver"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", "--window-size=1440,1100"]
REPO = Path(__file__).resolve().parents[2]
HOSTILE = "<img src=x onerror=\"window.__xss=1\"><b>bold</b>"


@pytest.fixture
def settings(prefix) -> Settings:
    """Auth on: the page must ask for a key and send it (also on the event stream)."""
    return Settings(redis_url=REDIS_URL, key_prefix=prefix, lease_s=2.0, sse_block_ms=200, admin_key=ADMIN_KEY)


class WebDriverError(Exception):
    pass


class Browser:
    """Headless Chromium through chromedriver: the few WebDriver verbs the test needs."""

    def __init__(self, profile: Path):
        chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
        if not chromium or not driver:
            pytest.fail(f"the board test needs Debian's chromium and chromedriver: {APT}", pytrace=False)
        port = free_port()
        self.proc = subprocess.Popen([driver, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
        try:
            self._wait_ready()
            caps = {"browserName": "chrome", "goog:chromeOptions": {
                "binary": chromium, "args": [*FLAGS, f"--user-data-dir={profile}"]}}
            self.sid = self._call("POST", "/session", {"capabilities": {"alwaysMatch": caps}})["sessionId"]
        except BaseException:
            self.proc.kill()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                if self.http.get("/status").json()["value"]["ready"]:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise WebDriverError("chromedriver did not start")

    def _call(self, method: str, path: str, body: dict | None = None):
        r = self.http.request(method, path, json=body)
        value = r.json()["value"]
        if r.status_code != 200:
            raise WebDriverError(f"{method} {path}: {value.get('error')}: {value.get('message')}")
        return value

    def cmd(self, method: str, path: str, body: dict | None = None):
        return self._call(method, f"/session/{self.sid}{path}", body)

    def open(self, url: str) -> None:
        self.cmd("POST", "/url", {"url": url})

    def js(self, script: str, *args):
        """Run `script` (a function body; `return` a JSON-able value) in the page."""
        return self.cmd("POST", "/execute/sync", {"script": script, "args": list(args)})

    def type(self, css: str, text: str) -> None:
        ref = self.cmd("POST", "/element", {"using": "css selector", "value": css})
        self.cmd("POST", f"/element/{next(iter(ref.values()))}/value", {"text": text})

    def wait(self, script: str, *args, timeout: float = 15.0, what: str = "condition"):
        """Poll `script` until it returns something truthy; return that."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.js(script, *args)
            if got:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"board never showed {what}; page says: {self.js(TEXT)!r}")
            time.sleep(0.05)

    def screenshot(self, *paths: Path) -> None:
        png = base64.b64decode(self.cmd("GET", "/screenshot"))
        for p in paths:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(png)

    def close(self) -> None:
        try:
            self.cmd("DELETE", "")
        finally:
            self.http.close()
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


TEXT = "return document.body.innerText.slice(0, 2000)"
PROGRESS = "const p = document.getElementById('progress-text'); return p && [+p.dataset.done, +p.dataset.total]"


@pytest.fixture
def browser(tmp_path):
    b = Browser(tmp_path / "chromium-profile")
    yield b
    b.close()


def test_board_is_public_static_and_locked_down(gateway):
    page = httpx.get(f"{gateway.url}/board")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert 'src="board/board.js"' in page.text
    for name, kind in (("board.js", "text/javascript"), ("board.css", "text/css")):
        r = httpx.get(f"{gateway.url}/board/{name}")
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind)
    assert httpx.get(f"{gateway.url}/board/secrets.py").status_code == 404
    assert "innerHTML" not in httpx.get(f"{gateway.url}/board/board.js").text
    assert httpx.get(f"{gateway.url}/v1/batches").status_code == 401  # the data stays behind the key


def test_board_shows_a_running_batch_live(gateway, settings, browser, tmp_path):
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    req = {"tasks": [{"seed": i} for i in range(8)], "env": "calc", "group_size": 2, "max_turns": 4,
           "sampling": {"max_tokens": 48}, "metadata": {"run": "board-test", "note": HOSTILE}}
    created = httpx.post(f"{gateway.url}/v1/batches", json=req, headers=auth)
    assert created.status_code == 202, created.text
    bid, total = created.json()["id"], created.json()["num_trajectories"]

    # Auth is on: the page asks for a key, and works once one is pasted.
    browser.open(f"{gateway.url}/board")
    browser.wait("const n = document.getElementById('notice'); return !n.hidden && n.textContent.includes('API key')",
                 what="the API-key prompt")
    browser.type("#apikey", ADMIN_KEY + "\n")
    browser.wait("return document.querySelector(`.batch-item[data-batch-id='${arguments[0]}']`)", bid,
                 what="the batch in the list")
    assert browser.wait("const h = document.getElementById('batch-id'); return h && h.textContent", what="the batch") == bid
    assert browser.wait(PROGRESS, what="progress") == [0, total]  # nothing runs yet
    assert browser.js("return localStorage.getItem('rollout-service.board.apiKey')") == ADMIN_KEY

    # Untrusted strings render as text.
    chips = browser.js("return [...document.querySelectorAll('.chips .chip')].map(c => [c.textContent, c.children.length])")
    assert [f"note={HOSTILE}", 0] in chips
    assert browser.js("return window.__xss === undefined && !document.querySelector('.chips img, .chips b')")

    # Now the batch runs; the page follows it without a reload.
    engine = SimEngine("sim-board", seed=3, time_scale=0.6)
    seen = set()
    with RunningWorker(settings, engines={"sim-board": (engine, "byte")}, concurrency=4):
        deadline = time.monotonic() + 25
        while True:
            done, _ = browser.js(PROGRESS)
            seen.add(done)
            if done == total or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    assert max(seen) == total, f"progress stuck at {sorted(seen)}"
    assert len(seen) >= 3, f"progress jumped instead of moving live: {sorted(seen)}"
    browser.wait("return document.querySelector('#batch-state .badge').textContent === 'completed'",
                 what="the batch completed")
    # Every row ends terminal with its timeline (turns arrive through the event stream).
    browser.wait("const rows = [...document.querySelectorAll('.traj')];"
                 "return rows.length === arguments[0] && rows.every(r => r.querySelectorAll('.track .turn').length)",
                 total, what="every trajectory's timeline")

    # One trajectory's turns: engine, policy version, timings, reward; matching the API.
    tid = browser.js("const r = document.querySelector('.traj[data-state=completed]') || document.querySelector('.traj');"
                     "r.querySelector('.grid').click(); return r.dataset.trajId")
    traj = httpx.get(f"{gateway.url}/v1/trajectories/{tid}", headers=auth).json()
    shown = browser.wait(
        "const r = document.querySelector(`.traj[data-traj-id='${arguments[0]}']`);"
        "const rows = r && [...r.querySelectorAll('.turn-row')];"
        "return rows && rows.length && {engines: rows.map(x => x.querySelector('.engine').textContent),"
        " policies: rows.map(x => x.querySelector('.policy').textContent),"
        " bars: [...r.querySelectorAll('.track .turn')].map(t => t.getBoundingClientRect().width),"
        " reward: r.querySelector('.reward').textContent, text: r.innerText}", tid, what="the trajectory's turns")
    assert shown["engines"] == ["sim-board"] * len(traj["turns"])
    assert shown["policies"] == [f"v{t['policy_version']}" for t in traj["turns"]]
    assert len(shown["bars"]) == len(traj["turns"]) and all(w > 0 for w in shown["bars"])
    assert float(shown["reward"]) == pytest.approx(traj["reward"], abs=1e-3)
    for phase in ("queue", "prefill", "decode", "tool"):
        assert phase in shown["text"].lower()
    assert browser.js("return document.getElementById('conn').dataset.state") == "live"

    browser.screenshot(tmp_path / "board.png", REPO / "test-output" / "board.png")


def test_a_batch_without_metadata_shows_no_null(gateway, browser):
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    created = httpx.post(f"{gateway.url}/v1/batches", json={"tasks": [{"seed": 1}], "env": "calc"}, headers=auth)
    bid = created.json()["id"]
    browser.open(f"{gateway.url}/board#{bid}")
    browser.wait("const n = document.getElementById('notice'); return !n.hidden && n.textContent.includes('API key')",
                 what="the API-key prompt")
    browser.type("#apikey", ADMIN_KEY + "\n")
    browser.wait("const h = document.getElementById('batch-id'); return h && h.textContent === arguments[0]", bid,
                 what="the batch")
    text = browser.js("return document.body.innerText")
    assert "null" not in text.split() and "undefined" not in text, text[:500]


def test_a_running_trajectory_shows_each_turn_as_it_finishes(gateway, settings, browser):
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    req = {"tasks": [{"seed": 1}], "env": "calc", "max_turns": 3}
    bid = httpx.post(f"{gateway.url}/v1/batches", json=req, headers=auth).json()["id"]
    browser.open(f"{gateway.url}/board#batch={bid}")
    browser.wait("const n = document.getElementById('notice'); return !n.hidden && n.textContent.includes('API key')",
                 what="the API-key prompt")
    browser.type("#apikey", ADMIN_KEY + "\n")
    row = f"document.querySelector(`.traj[data-traj-id='{bid}-0-0']`)"
    browser.wait(f"return {row}", what="the queued trajectory")
    browser.js("window.__samePage = true")  # gone if the page reloads

    # Each turn takes a couple of board polls (a calculator call every turn: never an answer).
    engine = SimEngine("sim-turns", time_scale=15.0, policy=always_calc)
    with RunningWorker(settings, engines={"sim-turns": (engine, "byte")}):
        seen = browser.wait(f"const r = {row}; const n = r && r.querySelectorAll('.track .turn').length;"
                            "return r && r.dataset.state === 'running' && n > 0"
                            " && [n, r.querySelector('.turns-n').textContent,"
                            " r.querySelectorAll('.track .turn .ph-prefill').length]",
                            timeout=30, what="a turn of the running trajectory")
        assert seen[2] == seen[0]  # each turn's bar shows its prefill (time to first token)
        shown = httpx.get(f"{gateway.url}/v1/trajectories/{bid}-0-0", headers=auth).json()
        assert shown["state"] == "running" and len(shown["turns"]) >= seen[0]
        assert seen[1] == str(seen[0])
        browser.wait(f"const r = {row}; return r && r.dataset.state === 'truncated'"
                     " && r.querySelectorAll('.track .turn').length === 3", timeout=30, what="the finished trajectory")
    assert browser.js("return window.__samePage === true")
