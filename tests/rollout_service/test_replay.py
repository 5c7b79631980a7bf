"""`rollout replay`: environments re-run from a recording, each env's replay claim checked, and
re-scoring with another reward function."""

from __future__ import annotations

import json
import time

import pytest

from env_workers import registry
from env_workers.envs import judge
from env_workers.resources import Pools
from rollout_service.cli import main
from rollout_service.recording import read, record, write
from rollout_service.replay import REPLAY_POOL, replay
from tests.rollout_service.test_recording import exported  # noqa: F401 - the fixture
from wire import Failure, FailureKind, Message, RolloutRequest, Trajectory, TrajectoryState, Turn

CODE_TASK = {"prompt": "Write `def add(a: int, b: int) -> int`.", "entry_point": "add",
             "tests": [{"args": [1, 2], "expected": 3}, {"args": [0, 0], "expected": 0}]}

# One scripted episode per registered environment, using its tools: each must replay exactly,
# or (where its spec says it may not) still replay exactly when the actions avoid the cause.
SCRIPTS: dict[str, tuple[dict, list[str]]] = {
    "calc": ({"seed": 3}, ["calc: 2 + 3 * 4", "calc: 1 / 0", "answer: 14"]),
    "math": ({"seed": 1}, ["answer: 42"]),
    "search_qa": ({"seed": 0}, ["search: Vamor Works", "open: doc-017", "answer: nobody"]),
    "shop": ({"seed": 0}, ["search[backpack grey]", "click[next >]", "click[< prev]", "click[back to search]"]),
    "textworld": ({"seed": 5, "level": 1}, ["look", "inventory", "take book", "put book in desk"]),
    "code": (CODE_TASK, ["no code yet", "```python\ndef add(a, b):\n    return a + b\n```"]),
    # (no unittest run: its report shows the run time, one of the causes swe's spec names)
    "swe": ({"seed": 0}, ["```bash\nls -1\n```", "```bash\nfind . -name '*.py' | sort | head -3\n```"]),
    "judge": ({"seed": 0}, ["A short, clear answer."]),
}


@pytest.fixture
def pools():
    p = Pools(REPLAY_POOL)
    yield p
    p.close()


@pytest.fixture
def fixed_judge(monkeypatch):
    monkeypatch.setattr(judge, "_default_judge", lambda messages: "score: 7")


def recorded(env: str, task: dict, actions: list[str], pools: Pools, sample_index: int = 0):
    """Run a scripted episode the way the rollout loop records one (through the env's sandbox
    claims, as an env worker), and return its recording."""
    e = registry.make(env, resources=pools.claims("recording"))
    opening, _ = e.reset(task, seed=sample_index)
    messages, turns, state, info = list(opening), [], TrajectoryState.truncated, {"truncated_by": "max_turns"}
    try:
        for i, action in enumerate(actions):
            r = e.step(action)
            messages += [Message(role="assistant", content=action), *r.observation]
            turns.append(Turn(index=i, prompt_ids=[1], output_ids=[2], output_logprobs=[-0.5], finish_reason="stop",
                              policy_version=0, engine_id="script", reward=r.reward))
            if r.terminated or r.truncated:
                state = TrajectoryState.completed if r.terminated else TrajectoryState.truncated
                info = {} if r.terminated else {"truncated_by": "env"}
                break
    finally:
        e.close()
        pools.release("recording")
    traj = Trajectory(id=f"b-0-{sample_index}", batch_id="b", group_index=0, sample_index=sample_index, env=env,
                      task=task, state=state, turns=turns, messages=messages, info=info,
                      reward=sum(t.reward for t in turns))
    return record(traj, RolloutRequest(tasks=[task], env=env))


def test_every_env_has_a_replay_script():
    # the catalog: envs this package ships (other test modules register envs of their own)
    catalog = {n for n in registry.names() if registry.spec(n).factory.__module__.startswith("env_workers.envs.")}
    assert catalog and set(SCRIPTS) == catalog


@pytest.mark.parametrize("env", sorted(SCRIPTS))
def test_every_env_replays_its_recording(env, pools, fixed_judge):
    task, actions = SCRIPTS[env]
    rec = recorded(env, task, actions, pools, sample_index=1)
    assert rec.replayable is None and len(rec.steps) >= 1
    v = replay(rec, pools)
    assert (v.outcome, v.turn) == ("match", None), v.detail
    assert pools.held("replay-b-0-1") == []  # the replay's sandboxes went back


@pytest.mark.parametrize("env", [n for n in sorted(SCRIPTS) if registry.spec(n).nondeterminism is None])
def test_a_deterministic_env_catches_a_changed_recording(env, pools):
    task, actions = SCRIPTS[env]
    rec = recorded(env, task, actions, pools)
    last = rec.steps[-1]
    last.reward += 0.5
    v = replay(rec, pools)
    assert (v.outcome, v.turn) == ("mismatch", last.turn) and "reward" in v.detail
    if len(rec.steps) > 1 and rec.steps[0].observation:
        rec.steps[-1].reward -= 0.5
        rec.steps[0].observation = [Message(role="user", content="something else")]
        v = replay(rec, pools)
        assert (v.outcome, v.turn) == ("mismatch", 0) and "observation" in v.detail


def test_swe_claim_output_showing_the_clock_differs_on_replay(pools):
    assert "clock" in registry.spec("swe").nondeterminism
    rec = recorded("swe", {"seed": 0}, ["```bash\nls -1\n```", "```bash\ndate +%s%N\n```", "submit"], pools)
    v = replay(rec, pools)
    assert (v.outcome, v.turn) == ("mismatch", 1) and "observation" in v.detail


def test_code_claim_code_that_reads_the_clock_may_score_differently(pools):
    assert "clock" in registry.spec("code").nondeterminism
    until = time.time() + 4.0  # passes while recorded, fails once replayed after this moment
    code = f"```python\nimport time\ndef add(a, b):\n    return a + b if time.time() < {until} else -1\n```"
    rec = recorded("code", CODE_TASK, [code], pools)
    assert rec.steps[0].reward == 1.0
    time.sleep(max(until - time.time(), 0.0) + 0.1)
    v = replay(rec, pools)
    assert (v.outcome, v.turn) == ("mismatch", 0) and "0/2 tests passed" in v.detail


def test_judge_claim_another_judge_scores_differently(pools, monkeypatch):
    assert "judge" in registry.spec("judge").nondeterminism
    monkeypatch.setattr(judge, "_default_judge", lambda messages: "score: 7")
    rec = recorded("judge", {"seed": 0}, ["An answer."], pools)
    assert replay(rec, pools).outcome == "match"
    monkeypatch.setattr(judge, "_default_judge", lambda messages: "score: 3")
    v = replay(rec, pools)
    assert (v.outcome, v.turn) == ("mismatch", 0) and "replayed 0.3, recorded 0.7" in v.detail


def test_a_step_the_env_rejected_in_the_recording_must_be_rejected_again(pools):
    rec = recorded("math", {"seed": 1}, ["answer: 1"], pools)
    rec.trajectory.state = TrajectoryState.failed
    rec.trajectory.failure = Failure(kind=FailureKind.rejected, message="bad action")
    rec.steps[0].observation = None  # as recorded when the step raised
    v = replay(rec, pools)
    assert (v.outcome, v.turn) == ("mismatch", 0) and "rejected here" in v.detail


def test_a_recording_that_ends_inside_a_step_matches_up_to_there(pools):
    rec = recorded("calc", {"seed": 3}, ["calc: 1 + 1", "answer: 2"], pools)
    rec.trajectory.state = TrajectoryState.failed
    rec.trajectory.failure = Failure(kind=FailureKind.timeout, message="deadline")
    rec.steps[1].observation = None  # the deadline ran out inside the step
    v = replay(rec, pools)
    assert v.outcome == "match" and "ended (timeout)" in v.detail
    rec.steps[0].reward = 9.0
    assert replay(rec, pools).turn == 0


def test_cli_replays_a_service_recording(exported, tmp_path, capsys):  # noqa: F811
    _, out = exported
    report = tmp_path / "verdicts.json"
    main(["replay", str(out), "--json", str(report)])  # all match: returns (exit status 0)
    verdicts = json.loads(report.read_text())
    assert len(verdicts) == 6 and {v["outcome"] for v in verdicts} == {"match"}
    assert "6 match, 0 mismatch, 0 skipped" in capsys.readouterr().out
    # The same file with one observation changed: exit status 1, and the turn is named.
    header, records = read(out)
    target = next(r for r in records if len(r.steps) > 1)
    target.steps[1].observation = [Message(role="user", content="result: 999")]
    bad = tmp_path / "bad.jsonl"
    with bad.open("w") as f:
        write(f, header.batch, header.request, [])
        for r in records:
            f.write(r.model_dump_json() + "\n")
    with pytest.raises(SystemExit) as e:
        main(["replay", str(bad), "--json", str(report)])
    assert e.value.code == 1
    got = {v["trajectory_id"]: v for v in json.loads(report.read_text())}
    assert got[target.trajectory.id]["outcome"] == "mismatch" and got[target.trajectory.id]["turn"] == 1
    assert sum(v["outcome"] == "match" for v in got.values()) == 5


def test_cli_rescores_with_another_reward_function(exported, tmp_path, monkeypatch, capsys):  # noqa: F811
    _, out = exported
    (tmp_path / "lenient.py").write_text(
        "def shorter_is_better(trajectory):\n"
        "    return 1.0 / len(trajectory.turns)\n")
    monkeypatch.chdir(tmp_path)
    report = tmp_path / "scores.json"
    main(["replay", str(out), "--score", "lenient:shorter_is_better", "--json", str(report)])
    rows = json.loads(report.read_text())
    _, records = read(out)
    want = {r.trajectory.id: (r.trajectory.reward, 1.0 / len(r.trajectory.turns)) for r in records}
    assert len(rows) == 6 and {r["trajectory_id"]: (r["recorded"], r["new"]) for r in rows} == want
    said = capsys.readouterr().out
    assert "GRPO advantage signs changed" in said and "not re-scored" not in said
    # a failed trajectory carries no reward to compare: counted aloud, not left out silently
    header, records = read(out)
    records[0].trajectory.state = TrajectoryState.failed
    records[0].trajectory.failure = Failure(kind=FailureKind.engine, message="engine lost")
    some_failed = tmp_path / "some_failed.jsonl"
    with some_failed.open("w") as f:
        write(f, header.batch, header.request, [])
        for r in records:
            f.write(r.model_dump_json() + "\n")
    main(["replay", str(some_failed), "--score", "lenient:shorter_is_better"])
    assert "1 of 6 not re-scored: failed or cancelled" in capsys.readouterr().out.replace("\n", " ")
    with pytest.raises(SystemExit, match="cannot load 'lenient:nope'"):
        main(["replay", str(out), "--score", "lenient:nope"])


def test_cli_refuses_a_file_that_is_not_a_recording(tmp_path):
    p = tmp_path / "tasks.jsonl"
    p.write_text('{"seed": 1}\n')
    with pytest.raises(SystemExit, match="not a rollout-recording file"):
        main(["replay", str(p)])


def test_unknown_env_is_skipped_not_crashed(pools):
    rec = recorded("math", {"seed": 1}, ["answer: 1"], pools)
    rec.trajectory.env = "gone"
    v = replay(rec, pools)
    assert v.outcome == "skipped" and "unknown environment 'gone'" in v.detail
