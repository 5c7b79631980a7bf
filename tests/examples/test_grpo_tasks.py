"""The GRPO example's tasks: held-out seeds never meet training seeds, and the format bonus
goes to the episodes that earned it (judged from real env transcripts)."""

from __future__ import annotations

import pytest

from env_workers.envs.calc import CalcEnv
from env_workers.envs.textworld import TextWorldEnv, generate
from examples.grpo.tasks import HELD_OUT_BASE, TASKS
from examples.grpo.trainer import Config
from wire import Message, Trajectory


def transcript(env, task: dict, actions: list[str], env_name: str) -> Trajectory:
    messages, _ = env.reset(task)
    messages = list(messages)
    state = "truncated"
    for a in actions:
        r = env.step(a)
        messages += [Message(role="assistant", content=a), *r.observation]
        if r.terminated:
            state = "completed"
            break
    return Trajectory(id="b-0-0", batch_id="b", group_index=0, sample_index=0, env=env_name, task=task,
                      state=state, messages=messages, reward=0.0)


def test_household_bonus_counts_valid_commands_and_the_goal_object_in_hand():
    spec = TASKS["household"]
    task = spec.make(7, 1)
    obj, target, _ = generate(7, 1).goal
    other = next(o for objs in generate(7, 1).contents.values() for o in objs if o != obj)
    assert spec.well_formed(transcript(TextWorldEnv(), task, [f"take {obj}"], "textworld")) == 1.0
    assert spec.well_formed(transcript(TextWorldEnv(), task, [f"take {other}"], "textworld")) == 0.25
    assert spec.well_formed(transcript(TextWorldEnv(), task, [f"put {obj} in {target}"], "textworld")) == 0.25
    assert spec.well_formed(transcript(TextWorldEnv(), task, ["dance", f"take {obj}"], "textworld")) == 0.875
    assert spec.well_formed(transcript(TextWorldEnv(), task, ["dance"], "textworld")) == 0.0


def test_calc_bonus_needs_a_call_then_an_answer():
    spec = TASKS["calc"]
    task = spec.make(3, 1)
    assert spec.well_formed(transcript(CalcEnv(), task, ["calc: 1 + 1", "answer: 2"], "calc"))
    assert not spec.well_formed(transcript(CalcEnv(), task, ["answer: 2"], "calc"))
    assert not spec.well_formed(transcript(CalcEnv(), task, ["calc: 1 + 1"], "calc"))


def test_reasoning_gym_bonus_needs_an_answer_in_tags_and_the_reward_is_its_scorer():
    from env_workers import registry

    spec = TASKS["rg-chain_sum"]
    task = spec.make(HELD_OUT_BASE + 3, 1)
    assert task["examples"] == 2 and spec.env == "reasoning_gym:chain_sum"
    env = registry.make(spec.env)
    question = env.reset(task)[0][-1].content
    answer = str(eval(question.rsplit(":", 1)[1].rstrip("= ")))  # "... problem: 4 - 1 =" -> "3"
    right = transcript(registry.make(spec.env), task, [f"<answer>{answer}</answer>"], spec.env)
    wrong = transcript(registry.make(spec.env), task, [f"<answer>{int(answer) + 1}</answer>"], spec.env)
    assert spec.well_formed(right) and spec.well_formed(wrong)
    assert not spec.well_formed(transcript(registry.make(spec.env), task, [answer], spec.env))
    r = registry.make(spec.env)
    r.reset(task)
    assert r.step(f"<answer>{answer}</answer>").reward == 1.0


def test_tasks_differ_by_seed_and_training_seeds_stay_below_held_out():
    cfg = Config(task="household", level=2, out=None)
    from examples.grpo.trainer import Trainer

    trainer = Trainer(client=None, learner=None, cfg=cfg)
    seeds = {trainer.next_task()["seed"] for _ in range(200)}
    assert len(seeds) > 190 and max(seeds) < HELD_OUT_BASE
    assert {trainer.next_task()["level"]} == {2}


def test_config_fills_the_task_defaults_and_rejects_unknown_tasks():
    cfg = Config(task="household")
    assert (cfg.max_turns, cfg.max_tokens, cfg.format_bonus, cfg.prompts, cfg.lr) == (4, 12, 0.4, 6, 5e-5)
    assert Config(task="calc", max_turns=5).max_turns == 5
    assert (Config(task="calc").prompts, Config(task="calc").lr) == (8, 2e-5)
    with pytest.raises(ValueError, match="unknown task"):
        Config(task="chess")


def test_a_training_step_records_its_figures_and_pushes_new_weights(tmp_path):
    """`train_and_push` with a stand-in learner and client: the bonus reaches the learner's
    rewards, the policy version advances, and the record holds the env's own success."""
    import asyncio
    from types import SimpleNamespace

    from examples.grpo.trainer import Trainer

    seen = {}

    class Learner:
        def step(self, trajs, advs):
            seen["rewards"] = [t.reward for t in trajs]
            return {"groups_trained": 1, "tokens": 4, "clip_frac": 0.0, "kl": 0.0, "loss": 0.0}

        def save(self, out):
            out.mkdir(parents=True)
            return out

    class Client:
        async def update_weights(self, path):
            seen["path"] = path
            return SimpleNamespace(version=8)

    spec = TASKS["household"]
    obj = generate(7, 1).goal[0]
    won = transcript(TextWorldEnv(), spec.make(7, 1), [f"take {obj}", f"put {obj} in {generate(7, 1).goal[1]}"],
                     "textworld")
    won.reward = 1.0
    lost = transcript(TextWorldEnv(), spec.make(7, 1), ["dance"], "textworld").model_copy(update={"id": "b-0-1"})
    cfg = Config(task="household", out=tmp_path, eval_tasks=0)
    trainer = Trainer(Client(), Learner(), cfg)
    trainer.version = 7
    asyncio.run(trainer.train_and_push(1, [won, lost], 3.0, set()))
    [rec] = trainer.history
    assert seen["rewards"] == [1.0 + cfg.format_bonus, 0.0] and seen["path"].endswith("step-1")
    assert (rec.version, rec.success, rec.well_formed, rec.train["groups_trained"]) == (8, 0.5, 0.5, 1)


def test_training_stops_once_held_out_success_reaches_the_target(capsys, tmp_path):
    from examples.grpo.__main__ import parse
    from examples.grpo.trainer import StepRecord, Trainer

    trainer = Trainer(client=None, learner=None, cfg=Config(task="household", target=0.9, eval_every=2))
    record = StepRecord(2, 3, 0.5, 0.5, 48, 0, 0, 0, 1.0, 1.0, 1.0, 3.0, held_out=0.5)
    trainer.history.append(record)
    assert not trainer.should_stop()
    record.held_out = 0.92
    assert trainer.should_stop() and "reached --target 0.9" in capsys.readouterr().out
    assert parse(["--task", "household", "--out", str(tmp_path)]).lr == 5e-5  # the task's, not calc's
    assert parse(["--task", "household", "--lr", "1e-4", "--out", str(tmp_path)]).lr == 1e-4
    with pytest.raises(SystemExit):
        parse(["--task", "household", "--target", "0.9"])  # no periodic check to compare with
    assert "--target needs --eval-every" in capsys.readouterr().err
