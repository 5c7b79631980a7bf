"""RL-Bench: the split, the workspace, the grader over real HTTP with a real grading service
(`serve --engine sim`: real Redis, `rollout up`, env worker, judge engine), records, summary."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import psutil
import pytest
import redis as syncredis

from benchmarks.rlbench import catalog, summary
from benchmarks.rlbench.evaluate import Evaluation, EvaluationFailed, score
from benchmarks.rlbench.grader import Grader
from benchmarks.rlbench.records import Records, RunRecord, Status, SubmissionRecord
from benchmarks.rlbench.server import create_app
from benchmarks.rlbench.workspace import State, setup
from scheduler.keys import Keys
from tests.conftest import REDIS_URL
from wire import EngineInfo, Trajectory

ROOT = Path(__file__).resolve().parents[2]


def fake_model(path: Path) -> Path:
    """A folder that passes as a model; the simulated engine reseeds its policy from the path."""
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"fake")
    return path


def make_state(tmp: Path, task: str, budget_min: float = 30.0) -> State:
    return setup(task, tmp / "ws", fake_model(tmp / "base"), budget_min)


# ---- the split and the workspace ----

def test_six_tasks_at_three_levels_split_train_and_test_by_content():
    assert {t.level for t in catalog.TASKS.values()} == set(catalog.Level)
    assert len(catalog.TASKS) == 6
    for spec in catalog.TASKS.values():
        sp = catalog.split(spec, "salt")
        contents = catalog.Contents(spec.env)
        train, test = {contents(t) for t in sp.train}, {contents(t) for t in sp.test}
        assert len(sp.train) == spec.n_train and len(sp.test) == spec.n_test
        assert not train & test, spec.name
        assert not {json.dumps(t) for t in sp.train} & {json.dumps(t) for t in sp.test}
        assert catalog.split(spec, "other salt").test != sp.test  # the salt decides the hidden set


@pytest.mark.parametrize("task", list(catalog.TASKS))
def test_setup_puts_no_test_task_anywhere_in_the_workspace(tmp_path, task):
    state = make_state(tmp_path, task)
    ws = Path(state.config.workspace)
    files = [p for p in ws.rglob("*") if p.is_file() and not p.is_relative_to(ws / "base_model")]
    assert {p.relative_to(ws).as_posix() for p in files} >= {"INSTRUCTIONS.md", "task.json", "data/train.jsonl"}
    text = "\n".join(p.read_text() for p in files)
    tests, contents = state.test_tasks(), catalog.Contents(state.task.env)
    assert len(tests) == state.task.n_test
    for t in tests:
        assert json.dumps(t) not in text
        assert contents(t) not in text
    assert state.config.salt not in text and str(state.dir) not in text
    assert not state.dir.is_relative_to(ws)
    assert (ws / "base_model").resolve() == Path(state.config.base_model)
    assert str(state.config.port) in (ws / "INSTRUCTIONS.md").read_text()


def test_setup_refuses_a_state_folder_inside_the_workspace_and_a_non_model(tmp_path):
    base = fake_model(tmp_path / "base")
    with pytest.raises(ValueError, match="outside the workspace"):
        setup("math", tmp_path / "ws", base, 10, state_dir=tmp_path / "ws" / "grader")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="config.json"):
        setup("math", tmp_path / "ws2", tmp_path / "empty", 10)


# ---- the grader as a real process, with its own grading service ----

class Served:
    def __init__(self, state: State, tmp: Path):
        self.state, self.prefix = state, f"rstest:rlbench:{uuid.uuid4().hex[:8]}:"
        env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUT_")}
        env["ROLLOUT_SANDBOX_WARM"] = "0"  # no idle sandboxes: these tasks need none
        self.log = tmp / "serve.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.rlbench", "serve", str(state.dir), "--engine", "sim",
                 "--redis-url", REDIS_URL, "--key-prefix", self.prefix],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while "grader http" not in self.log.read_text():
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, "the grader did not start"
            time.sleep(0.2)
        self.url = state.config.url
        self.http = httpx.Client(base_url=self.url, timeout=120)

    def submit(self, model) -> httpx.Response:
        return self.http.post("/submit", json={"model": str(model)})

    def stop(self) -> None:
        self.http.close()
        children = psutil.Process(self.proc.pid).children(recursive=True)
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)
        _, alive = psutil.wait_procs(children, timeout=15)
        r = syncredis.Redis.from_url(REDIS_URL)
        if keys := list(r.scan_iter(match=f"{self.prefix}*", count=1000)):
            r.delete(*keys)
        assert not alive, f"left running: {[p.cmdline() for p in alive]}"


@pytest.fixture(scope="module")
def math_grader(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rlbench-math")
    served = Served(make_state(tmp, "math"), tmp)
    yield served
    served.stop()


def test_health_and_time(math_grader):
    h = math_grader.http.get("/health").json()
    assert h["task"] == "math" and h["level"] == "static rule-based" and h["status"] == "ok"
    assert 0.0 <= h["baseline"] <= 1.0 and h["best"] >= h["baseline"]
    t = math_grader.http.get("/time").json()
    assert t["budget_s"] == 1800 and not t["spent"]
    assert 0 < t["remaining_s"] <= 1800 and t["remaining_s"] == pytest.approx(1800 - t["elapsed_s"], abs=0.01)


def test_submissions_are_scored_against_the_baseline_and_recorded(math_grader, tmp_path):
    ws = Path(math_grader.state.config.workspace)
    baseline = math_grader.http.get("/health").json()["baseline"]
    scores, best = [], baseline
    # Other weights, other greedy answers: the sim engine reseeds from the loaded folder's path
    # (which lies under pytest's tmp folder, so it differs from run to run). Two seeds can still
    # score the same by chance (a mean over 64 right-or-wrong answers: about 1 time in 13), so
    # submit other folders until one scores differently from the first; 8 equal in a row would
    # be odds of about 1 in 10^8, or reloading not changing the policy.
    for name in "abcdefgh":
        fake_model(ws / "checkpoints" / name)
        r = math_grader.submit(f"checkpoints/{name}")
        assert r.status_code == 200, r.text
        got = r.json()
        best = max(best, got["score"])
        assert got["baseline"] == baseline
        assert got["improvement"] == pytest.approx(got["score"] - baseline, abs=1e-6)
        assert got["best"] == best
        assert got["n_tasks"] == got["usable"] == 64 and got["failures"] == {}
        scores.append(got["score"])
        if len(set(scores)) > 1:
            break
    assert len(set(scores)) == 2, scores
    again = math_grader.submit("base_model").json()  # the base model again: the same greedy evaluation
    assert again["score"] == baseline and again["improvement"] == 0 and again["best"] == best

    records = math_grader.state.records
    run = records.run(math_grader.state.config.run)
    subs = [s for s in records.submissions(run.run) if s.status is Status.scored]
    assert run.baseline == baseline and run.engine == "sim"
    assert [s.score for s in subs][-len(scores) - 1:] == [*scores, baseline]
    assert all(s.model.startswith(str(ws)) or s.model == str(run.base_model) for s in subs)

    out = subprocess.run([sys.executable, "-m", "benchmarks.rlbench", "summary", str(math_grader.state.dir),
                          "--json", str(tmp_path / "s.json")], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert f"baseline                  {baseline:.4f}" in out.stdout
    assert f"best                      {best:.4f}" in out.stdout
    [js] = json.loads((tmp_path / "s.json").read_text())
    assert js["best"] == best and [p["score"] for p in js["series"]][-len(scores) - 1:] == [*scores, baseline]
    assert (js["first_improvement_s"] is None) == (max(scores) <= baseline)


@pytest.mark.parametrize("body, status, code", [
    ({"model": "no/such/folder"}, 404, "model_not_found"),
    ({"model": "data"}, 422, "not_a_model"),  # a folder, without config.json
    ({"model": 5}, 422, "invalid_request"),
    ({"model": "base_model", "extra": 1}, 422, "invalid_request"),
    (b'{"model": ', 422, "invalid_request"),
])
def test_bad_submissions_get_a_4xx_in_the_one_error_shape(math_grader, body, status, code):
    before = len(math_grader.state.records.read())
    if isinstance(body, bytes):
        r = math_grader.http.post("/submit", content=body, headers={"content-type": "application/json"})
    else:
        r = math_grader.http.post("/submit", json=body)
    assert r.status_code == status
    assert set(r.json()) == {"error"} and r.json()["error"]["code"] == code and r.json()["error"]["message"]
    recorded = math_grader.state.records.read()[before:]
    if code != "invalid_request":  # a submission the grader checked is recorded, refused or not
        assert [(s.status, s.error.split(":")[0]) for s in recorded] == [(Status.rejected, code)]


def test_the_judge_stays_fixed_while_submissions_load(tmp_path):
    served = Served(make_state(tmp_path, "instruct"), tmp_path)
    try:
        ws = Path(served.state.config.workspace)
        fake_model(ws / "checkpoints" / "x")
        r = served.submit("checkpoints/x")
        assert r.status_code == 200, r.text
        assert r.json()["failures"] == {} and 0 <= r.json()["score"] <= 1  # every answer got a judge's score
        policy, judge = (engines(served.prefix), engines(served.prefix + "judge:"))
        assert list(policy) == ["engine-0"] and policy["engine-0"].policy_version == 2  # baseline, then x
        assert list(judge) == ["judge"] and judge["judge"].policy_version == 0
    finally:
        served.stop()


def engines(prefix: str) -> dict[str, EngineInfo]:
    r = syncredis.Redis.from_url(REDIS_URL)
    return {k.decode(): EngineInfo.model_validate_json(v) for k, v in r.hgetall(Keys(prefix).engines).items()}


# ---- the grader in-process, with a fake evaluator and clock ----

class FakeEvaluator:
    """Scores by folder name; `broken*` fails as the grading service would. Tracks overlap."""

    def __init__(self):
        self.calls, self.running, self.most = 0, 0, 0

    async def __call__(self, model: Path) -> Evaluation:
        self.calls += 1
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(0.05)
            if model.name.startswith("broken"):
                raise EvaluationFailed("engine gone", {"engine": 3})
            return Evaluation({"base": 0.5, "good": 0.75}.get(model.name, 0.25), 4, 4, 1, 0.05, 1)
        finally:
            self.running -= 1


async def test_budget_serialization_failures_and_restart(tmp_path):
    state = make_state(tmp_path, "math", budget_min=1)
    now = [1000.0]
    ev = FakeEvaluator()
    grader = Grader(state, ev, engine="fake", clock=lambda: now[0])
    assert (await grader.start()).baseline == 0.5
    ws = Path(state.config.workspace)
    for name in ("good", "meh", "broken"):
        fake_model(ws / name)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(create_app(grader)), base_url="http://t") as c:
        good, meh = await asyncio.gather(c.post("/submit", json={"model": "good"}),
                                         c.post("/submit", json={"model": "meh"}))
        assert ev.most == 1  # one evaluation at a time
        assert good.json()["improvement"] == 0.25 and meh.json()["improvement"] == -0.25
        assert good.json()["best"] == 0.75 and meh.json()["best"] in (0.5, 0.75)  # either may arrive first
        r = await c.post("/submit", json={"model": "broken"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "evaluation_failed"
        now[0] += 61
        assert (await c.get("/time")).json() | {"started_at": 0} == {
            "budget_s": 60.0, "started_at": 0, "elapsed_s": 61.0, "remaining_s": 0.0, "spent": True}
        r = await c.post("/submit", json={"model": "good"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "budget_spent"
    subs = state.records.submissions(state.config.run)
    assert [s.status for s in subs] == [Status.scored, Status.scored, Status.failed, Status.rejected]
    assert subs[2].failures == {"engine": 3}

    again = Grader(state, ev, engine="fake", clock=lambda: now[0])
    calls = ev.calls
    run = await again.start()
    assert ev.calls == calls and run.started_at == 1000.0  # baseline and clock kept across a restart
    assert again.best == 0.75 and again.count == 4


# ---- scoring and the summary, on synthetic data ----

def traj(i: int, state: str, reward: float | None, version: int = 1, failure: str | None = None) -> Trajectory:
    turns = [{"index": 0, "prompt_ids": [1], "output_ids": [2], "output_logprobs": [-0.1], "finish_reason": "stop",
              "policy_version": version, "engine_id": "e"}]
    return Trajectory.model_validate({
        "id": f"t{i}", "batch_id": "b", "group_index": i, "sample_index": 0, "env": "math", "task": {}, "state": state,
        "turns": turns, "reward": reward, "failure": failure and {"kind": failure, "message": "x"}})


def test_score_leaves_infrastructure_failures_out_and_refuses_stale_weights():
    ok = [traj(i, "completed", float(i % 2)) for i in range(18)] + [traj(18, "truncated", 0.0)]
    ev = score([*ok, traj(19, "failed", None, failure="engine")], version=1, seconds=1.0)
    assert (ev.score, ev.usable, ev.truncated, ev.failures) == (round(9 / 19, 6), 19, 1, {"engine": 1})
    with pytest.raises(EvaluationFailed, match="usable"):
        score([*ok[:5], *(traj(i, "failed", None, failure="env") for i in range(5))], 1, 1.0)
    with pytest.raises(EvaluationFailed, match="other weights"):
        score([*ok, traj(20, "completed", 1.0, version=0)], 1, 1.0)


def test_summary_from_records(tmp_path, capsys):
    records = Records(tmp_path / "records.jsonl")
    base = {"task": "shop", "level": "closed-loop interactive", "env": "shop", "engine": "sim", "budget_s": 3600,
            "started_at": 0.0, "baseline_eval_s": 1.0, "n_test": 16, "base_model": "/m", "workspace": "/w"}
    records.append(RunRecord("r1", baseline=0.5, **base))
    for n, t, status, sc, fails, err in [(1, 60, "scored", 0.4, {"env": 2}, None),
                                         (2, 90, "rejected", None, {}, "not_a_model: no config.json"),
                                         (3, 300, "scored", 0.6, {"timeout": 1}, None),
                                         (4, 400, "failed", None, {"engine": 5}, "evaluation_failed: x")]:
        records.append(SubmissionRecord("r1", n, t, t, f"/c/{n}", Status(status), score=sc, failures=fails, error=err))
    records.append(RunRecord("r2", baseline=0.9, **base))
    records.append(SubmissionRecord("r2", 1, 10, 10, "/c", Status.scored, score=0.8))

    s1, s2 = summary.main([str(tmp_path)], str(tmp_path / "out.json"))
    assert (s1.best, s1.first_improvement_s, s1.submissions) == (0.6, 300, 4)
    assert s1.by_status == {"scored": 2, "rejected": 1, "failed": 1} and s1.rejected == {"not_a_model": 1}
    assert s1.failures == {"env": 2, "timeout": 1, "engine": 5}
    assert [p["score"] for p in s1.series] == [0.5, 0.4, 0.6]
    assert (s2.best, s2.first_improvement_s, s2.improvement) == (0.9, None, 0.0)
    out = capsys.readouterr().out
    assert "time to first improvement 5:00" in out and "time to first improvement never" in out
    assert "0:00 0.5000 base | 1:00 0.4000 | 5:00 0.6000" in out
    assert "engine=5 env=2 timeout=1" in out
    assert len(json.loads((tmp_path / "out.json").read_text())) == 2
    assert summary.summarize(records.read(), margin=0.1)[0].first_improvement_s is None  # 0.6 is not > 0.5 + 0.1
