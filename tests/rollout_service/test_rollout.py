"""The multi-turn loop with a scripted engine and in-process environments."""

from __future__ import annotations

import itertools

import pytest

from env_workers.client import LocalEnvs
from rollout_service.engines.base import EngineError
from rollout_service.engines.fleet import Fleet
from rollout_service.engines.sim import SimEngine
from rollout_service.rollout import run_episode
from rollout_service.tokens import ByteTokenizer
from scheduler.store import Work
from wire import FailureKind, RolloutRequest, SamplingParams, TrajectoryState

TOK = ByteTokenizer()


def scripted(*replies: str):
    it = itertools.cycle(replies)
    return lambda prompt, rng: next(it)


def work(env="calc", task=None, **kw) -> Work:
    params = RolloutRequest(tasks=[{}], env=env, **kw)
    return Work("b-0-0", "b", 0, 0, task or {"question": "What is 6*7?", "answer": 42}, params)


def fleet(*engines) -> Fleet:
    return Fleet({e.id: (e, "byte") for e in engines})


async def test_calc_episode_keeps_exact_tokens_and_masks():
    eng = SimEngine(policy=scripted("calc: 6 * 7", "answer: 42"))
    traj = await run_episode(work(), fleet(eng), LocalEnvs())
    assert traj.state is TrajectoryState.completed and traj.reward == 1.0 and len(traj.turns) == 2
    t0, t1 = traj.turns
    # sampled ids are exactly what the engine returned, eos included
    assert t0.output_ids == [*TOK.encode("calc: 6 * 7"), TOK.eos_id]
    # the observation enters as prompt tokens (mask 0), never as sampled tokens
    assert "result: 42" in TOK.decode(t1.prompt_ids)
    assert traj.loss_mask == [0] * len(t0.prompt_ids) + [1] * len(t0.output_ids) + \
        [0] * len(t1.prompt_ids) + [1] * len(t1.output_ids)
    assert len(traj.logprobs) == len(traj.token_ids) == len(traj.loss_mask)
    # what the engine saw on turn 2 is the concatenation of everything before it
    assert TOK.decode(traj.token_ids).count("<|im_start|>assistant") == 2
    assert [m.role for m in traj.messages] == ["system", "user", "assistant", "user", "assistant"]


async def test_max_turns_truncates():
    eng = SimEngine(policy=scripted("calc: 1 + 1"))
    traj = await run_episode(work(max_turns=3), fleet(eng), LocalEnvs())
    assert traj.state is TrajectoryState.truncated and len(traj.turns) == 3
    assert traj.info["truncated_by"] == "max_turns" and traj.reward == 0.0


@pytest.mark.parametrize("max_turns", [2, 3])
async def test_every_turn_but_the_last_is_handed_on_as_it_finishes(max_turns):
    """The worker records these durably mid-episode; the last comes with the result instead."""
    eng = SimEngine(policy=scripted("calc: 1 + 1"))
    handed = []

    async def on_turn(turn):
        handed.append(turn.index)

    traj = await run_episode(work(max_turns=max_turns), fleet(eng), LocalEnvs(), on_turn=on_turn)
    assert len(traj.turns) == max_turns and handed == list(range(max_turns - 1))
    eng = SimEngine(policy=scripted("calc: 6 * 7", "answer: 42"))  # ended by the env, not the limit
    handed.clear()
    traj = await run_episode(work(max_turns=max_turns), fleet(eng), LocalEnvs(), on_turn=on_turn)
    assert traj.state is TrajectoryState.completed and len(traj.turns) == 2 and handed == [0]


async def test_token_budget_truncates():
    eng = SimEngine(policy=scripted("calc: 1 + 1 " + "x" * 40))
    traj = await run_episode(work(max_total_tokens=400, sampling=SamplingParams(max_tokens=64)), fleet(eng),
                             LocalEnvs())
    assert traj.state is TrajectoryState.truncated and traj.info["truncated_by"] == "max_total_tokens"
    assert len(traj.token_ids) <= 400


async def test_per_turn_max_tokens_cuts_the_reply():
    eng = SimEngine(policy=scripted("answer: 42 and a long explanation"))
    traj = await run_episode(work(env="math", sampling=SamplingParams(max_tokens=5)), fleet(eng), LocalEnvs())
    assert traj.turns[0].finish_reason == "length" and len(traj.turns[0].output_ids) == 5


class Broken:
    id, policy_version = "broken", 0

    async def generate(self, req):
        raise EngineError("boom")

    async def aclose(self):
        pass


async def test_turn_fails_over_to_a_healthy_engine():
    good = SimEngine("good", policy=scripted("answer: 42"))
    f = Fleet({"a-broken": (Broken(), "byte"), "good": (good, "byte")})
    traj = await run_episode(work(env="math"), f, LocalEnvs())
    assert traj.state is TrajectoryState.completed and traj.turns[0].engine_id == "good"


async def test_engine_failure_is_data_with_kind_engine():
    traj = await run_episode(work(env="math"), Fleet({"b": (Broken(), "byte")}), LocalEnvs())
    assert traj.state is TrajectoryState.failed and traj.failure.kind is FailureKind.engine
    assert traj.reward is None  # never turned into reward 0


async def test_bad_task_is_a_rejected_failure_never_retried():
    traj = await run_episode(work(env="math", task={"nothing": 1}), fleet(SimEngine()), LocalEnvs())
    assert traj.failure.kind is FailureKind.rejected and "bad math task" in traj.failure.message
    assert not traj.failure.kind.retryable and not traj.failure.kind.infrastructure


async def test_deadline_is_a_timeout_failure():
    slow = SimEngine(policy=scripted("calc: 1+1"), time_scale=1000.0)
    traj = await run_episode(work(deadline_s=0.2), fleet(slow), LocalEnvs())
    assert traj.failure.kind is FailureKind.timeout


@pytest.mark.parametrize("seed", [None, 7])
async def test_sim_engine_is_deterministic_given_a_seed(seed):
    a = await run_episode(work(sampling=SamplingParams(seed=seed)), fleet(SimEngine(seed=3)), LocalEnvs())
    b = await run_episode(work(sampling=SamplingParams(seed=seed)), fleet(SimEngine(seed=3)), LocalEnvs())
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs


class ThinkStripping(ByteTokenizer):
    """A template that, like some reasoning models', drops earlier turns' <think> blocks."""

    def render(self, messages, add_generation_prompt):
        import re

        from wire import Message

        last_asst = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
        kept = [Message(role=m.role, content=re.sub(r"<think>.*?</think>", "", m.content, flags=re.S))
                if m.role == "assistant" and i < last_asst + (0 if add_generation_prompt else 1) else m
                for i, m in enumerate(messages)]
        return super().render(kept, add_generation_prompt)


class Recording(SimEngine):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.prompts: list[list[int]] = []

    async def generate(self, req):
        self.prompts.append(list(req.prompt_ids))
        return await super().generate(req)


@pytest.mark.parametrize("mode,segments", [("append", 1), ("rerender", 2)])
async def test_each_sample_is_exactly_what_the_engine_saw(mode, segments):
    from rollout_service.tokens import register_tokenizer

    register_tokenizer("think-strip", ThinkStripping())
    eng = Recording(policy=scripted("<think>hmm</think>calc: 2 + 2"))
    traj = await run_episode(work(max_turns=3, context=mode), Fleet({eng.id: (eng, "think-strip")}), LocalEnvs())
    assert len(traj.turns) == 3 and len(traj.samples()) == segments
    # every engine call's prompt is a prefix of its sample; the sample ends with what was sampled
    for turn, prompt in zip(traj.turns, eng.prompts):
        sample = traj.samples()[turn.segment].token_ids
        assert sample[: len(prompt)] == prompt
        assert sample[len(prompt): len(prompt) + len(turn.output_ids)] == turn.output_ids
    if segments > 1:
        with pytest.raises(ValueError, match="samples"):
            traj.token_ids


class NoSandbox:
    """An environment whose sandbox cannot be had."""

    def reset(self, task, seed=None):
        from wire import Message

        return [Message(role="user", content="run it")], {}

    def step(self, action):
        from env_workers.env import SandboxUnavailable

        raise SandboxUnavailable("pool exhausted after 30 s")

    def close(self):
        pass


async def test_sandbox_trouble_is_a_sandbox_failure():
    from env_workers.registry import EnvSpec, names, register

    if "no_sandbox" not in names():
        register(EnvSpec("no_sandbox", NoSandbox, "test: sandbox never available", example_tasks=[{}]))
    traj = await run_episode(work(env="no_sandbox", task={}), fleet(SimEngine()), LocalEnvs())
    assert traj.state is TrajectoryState.failed and traj.failure.kind is FailureKind.sandbox
    assert "pool exhausted" in traj.failure.message and traj.failure.kind.infrastructure


class SlowTool:
    """A tool call that times out: the model reads it as text, the turn records its kind."""

    def reset(self, task, seed=None):
        from wire import Message

        return [Message(role="user", content="run it")], {}

    def step(self, action):
        from env_workers.env import StepResult
        from wire import Message

        return StepResult([Message(role="user", content="[timed out after 10s]")], 0.0, False, False,
                          {"tool_failure": "timeout"})

    def close(self):
        pass


async def test_tool_failure_is_recorded_on_the_turn():
    from env_workers.registry import EnvSpec, names, register

    if "slow_tool" not in names():
        register(EnvSpec("slow_tool", SlowTool, "test: every tool call times out", example_tasks=[{}]))
    traj = await run_episode(work(env="slow_tool", task={}, max_turns=2), fleet(SimEngine()), LocalEnvs())
    assert traj.failure is None and traj.state is TrajectoryState.truncated
    assert [t.tool_failure for t in traj.turns] == ["timeout", "timeout"]


class NanReward:
    """An environment whose reward code fails on some output: a NaN reward."""

    def reset(self, task, seed=None):
        from wire import Message

        return [Message(role="user", content="go")], {}

    def step(self, action):
        from env_workers.env import StepResult

        return StepResult([], float("nan"), True, False)

    def close(self):
        pass


async def test_a_reward_that_is_not_a_finite_number_fails_the_trajectory_as_the_envs(redis, keys):
    """A NaN reward was recorded as the trajectory's reward; with the batch's totals kept by the
    finishing script it made that script fail half way (the batch never finished). It is the
    environment's fault, said as such; and a NaN that reaches the queue anyway is kept out of
    the totals."""
    from env_workers.registry import EnvSpec, names, register
    from scheduler.queue import Queue
    from scheduler.store import Store
    from wire import RolloutRequest, Trajectory

    if "nan_reward" not in names():
        register(EnvSpec("nan_reward", NanReward, "test: a NaN reward", example_tasks=[{}]))
    traj = await run_episode(work(env="nan_reward", task={}), fleet(SimEngine()), LocalEnvs())
    assert traj.state is TrajectoryState.failed and traj.failure.kind is FailureKind.env
    assert "reward of nan, not a finite number" in traj.failure.message and traj.reward is None
    q, store = Queue(redis, keys), Store(redis, keys)
    b = await q.enqueue(RolloutRequest(tasks=[{}, {}], env="math"))
    for c, reward in zip(await q.claim_many("w", 2), (float("nan"), 0.5)):
        t = Trajectory(id=c.trajectory_id, batch_id=b.id, group_index=0, sample_index=0, env="math", task={},
                       state=TrajectoryState.completed, reward=reward)
        assert await q.complete(c, t)
    st = await store.batch_status(b.id)
    assert st.finished_at is not None and st.totals.rewarded == 1 and st.totals.mean_reward == 0.5
