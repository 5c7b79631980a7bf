"""`rollout export`: a batch run by the real service, written to a self-contained recording."""

from __future__ import annotations

import json

import httpx
import pytest

from rollout_service.cli import main
from rollout_service.recording import RecordingError, read
from rollout_service.rollout import turn_seed
from tests.conftest import RunningWorker
from wire.recording import FORMAT, VERSION

TASKS = [{"seed": 3}, {"seed": 5}, {"question": "What is 12 times 12?", "answer": 144}]


def run_batch(gateway, settings, env: str = "calc", tasks=TASKS, group_size: int = 2) -> str:
    with httpx.Client(base_url=gateway.url) as c, RunningWorker(settings):
        bid = c.post("/v1/batches", json={"tasks": tasks, "env": env, "group_size": group_size, "max_turns": 4,
                                          "sampling": {"seed": 7, "max_tokens": 64}}).json()["id"]
        with c.stream("GET", f"/v1/batches/{bid}/events", timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("event: done"):
                    break
    return bid


@pytest.fixture
def exported(gateway, settings, tmp_path):
    bid = run_batch(gateway, settings)
    out = tmp_path / "rec.jsonl"
    main(["export", bid, "-o", str(out), "--url", gateway.url])
    return bid, out


def test_export_records_everything_a_replay_needs(exported, gateway):
    bid, out = exported
    lines = out.read_text().splitlines()
    head = json.loads(lines[0])
    assert head["format"] == FORMAT and head["version"] == VERSION
    assert head["request"]["tasks"] == TASKS and head["request"]["sampling"]["seed"] == 7
    assert head["batch"]["id"] == bid and head["batch"]["state"] == "completed"
    header, records = read(out)
    assert len(records) == len(lines) - 1 == 6
    with httpx.Client(base_url=gateway.url) as c:
        for rec in records:
            t = rec.trajectory
            stored = c.get(f"/v1/trajectories/{t.id}").json()
            assert t.model_dump(mode="json") == stored  # the trajectory exactly as the service keeps it
            assert rec.replayable is None and rec.env_seed == t.sample_index
            assert rec.opening and rec.opening == t.messages[: len(rec.opening)]
            assert len(rec.steps) == len(t.turns) > 0
            for st, turn in zip(rec.steps, t.turns):
                assert st.sampling_seed == turn_seed(7, t.group_index, t.sample_index, turn.index)
                assert st.reward == turn.reward and st.observation is not None
                assert turn.output_ids and len(turn.output_logprobs) == len(turn.output_ids) and turn.prompt_ids
                assert turn.engine_id == "sim-0" and turn.policy_version == 0
                assert turn.timings.prefill_s > 0 and turn.timings.decode_s > 0 and turn.timings.tool_s > 0
            assert [s.done for s in rec.steps] == [False] * (len(rec.steps) - 1) + [t.state.value == "completed"]
    # the toy policy used the calculator somewhere: multi-turn episodes are split turn by turn
    assert any(len(r.steps) > 1 and r.steps[0].observation for r in records)


def test_export_latest_is_the_newest_batch(exported, gateway, tmp_path):
    bid, out = exported
    again = tmp_path / "latest.jsonl"
    main(["export", "latest", "-o", str(again), "--url", gateway.url])
    (_, r1), (h2, r2) = read(out), read(again)
    assert h2.batch.id == bid and [r.trajectory for r in r2] == [r.trajectory for r in r1]


def test_export_of_an_unknown_batch_fails_clearly(gateway, tmp_path, capsys):
    out = tmp_path / "nope.jsonl"
    with pytest.raises(SystemExit) as e:
        main(["export", "no-such-batch", "-o", str(out), "--url", gateway.url])
    assert e.value.code == 1 and "no batch 'no-such-batch'" in capsys.readouterr().out
    assert not out.exists() and not list(tmp_path.iterdir())
    with httpx.Client(base_url=gateway.url) as c:
        r = c.get("/v1/batches/no-such-batch/request")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_a_failed_trajectory_is_recorded_with_its_failure(gateway, settings, tmp_path):
    # A task the environment rejects at reset: failed (rejected), no transcript to replay.
    bid = run_batch(gateway, settings, env="math", tasks=[{"nonsense": 1}, {"seed": 1}], group_size=1)
    out = tmp_path / "f.jsonl"
    main(["export", bid, "-o", str(out), "--url", gateway.url])
    _, records = read(out)
    bad = next(r for r in records if r.trajectory.task == {"nonsense": 1})
    assert bad.trajectory.failure.kind.value == "rejected" and bad.replayable and not bad.steps
    good = next(r for r in records if r.trajectory.task == {"seed": 1})
    assert good.replayable is None and len(good.steps) == 1


@pytest.mark.parametrize("first, why", [("{}", "not a rollout-recording file"), ("nope", "not JSON"),
                                        ('{"format": "rollout-recording", "version": 99}', "format version 99")])
def test_read_refuses_what_it_cannot_read(tmp_path, first, why):
    p = tmp_path / "x.jsonl"
    p.write_text(first + "\n")
    with pytest.raises(RecordingError, match=why):
        read(p)
