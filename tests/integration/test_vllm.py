"""The service driving a real vLLM CPU server with SmolLM2: token-in/token-out, exact
token accounting over five turns, and a weight update that really changes the weights."""

from __future__ import annotations

import asyncio
import math
import shutil

import pytest

from env_workers.client import LocalEnvs
from env_workers.env import EnvError, StepResult
from env_workers.registry import EnvSpec, names, register
from rollout_service.engines.fleet import Fleet
from rollout_service.engines.vllm import VLLMEngine
from rollout_service.rollout import run_episode
from rollout_service.tokens import load_tokenizer
from scheduler.registry import Registry
from scheduler.store import Work
from tests.conftest import RunningWorker
from trainer_client import RolloutClient
from wire import EngineInfo, Message, RolloutRequest, SamplingParams, TrajectoryState

pytestmark = pytest.mark.integration


class FiveTurns:
    """Keeps the conversation going for exactly five turns, whatever the model says."""

    def reset(self, task, seed=None):
        self.n = 0
        return [Message(role="system", content="You are a helpful assistant. Answer briefly."),
                Message(role="user", content="Name a fruit.")], {}

    def step(self, action):
        if self.n >= 5:
            raise EnvError("episode over")
        self.n += 1
        done = self.n == 5
        return StepResult([] if done else [Message(role="user", content=f"Thanks. Name another one ({self.n}).")],
                          float(done), done, False, {})

    def close(self):
        pass


if "five_turns" not in names():
    register(EnvSpec("five_turns", FiveTurns, "test: five turns of chat", example_tasks=[{}]))


class Spy(VLLMEngine):
    """Records each prompt; VLLMEngine itself fails the turn unless vLLM echoes it exactly."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.prompts: list[list[int]] = []

    async def generate(self, req):
        res = await super().generate(req)
        self.prompts.append(list(req.prompt_ids))
        return res


def work(env: str, tid: str, **kw) -> Work:
    return Work(tid, "it", 0, 0, {"seed": 3}, RolloutRequest(tasks=[{}], env=env, **kw))


async def test_five_turns_engine_saw_exactly_the_trajectory(vllm_server):
    spy = Spy("vllm", vllm_server.url, vllm_server.name)
    fleet = Fleet({"vllm": (spy, str(vllm_server.model_dir))})
    traj = await run_episode(work("five_turns", "five", sampling=SamplingParams(max_tokens=24, seed=1)), fleet,
                             LocalEnvs())
    assert traj.state is TrajectoryState.completed and len(traj.turns) == 5, traj.failure
    assert len(spy.prompts) == 5
    running: list[int] = []
    for turn, seen in zip(traj.turns, spy.prompts):
        running += turn.prompt_ids
        assert seen == running  # what vLLM saw == our concatenation, every turn
        running += turn.output_ids
    assert running == traj.token_ids
    tok = load_tokenizer(str(vllm_server.model_dir))
    # the observation text went in as prompt tokens; the sampled ids were never re-tokenized
    assert "Name another one (4)." in tok.decode(traj.token_ids)
    assert traj.loss_mask.count(1) == sum(len(t.output_ids) for t in traj.turns)
    # vLLM's per-request metrics split each turn: time to first token is the prefill
    assert all(t.timings.prefill_s > 0 and t.timings.decode_s > 0 for t in traj.turns)
    await fleet.aclose()


async def test_calc_batch_through_the_service(vllm_server, gateway, settings, redis, keys):
    await Registry(redis, keys).add_engine(EngineInfo(id="vllm-0", url=vllm_server.url, model=vllm_server.name,
                                                      tokenizer=str(vllm_server.model_dir)))
    with RunningWorker(settings, discover=True), RolloutClient(gateway.url) as c:
        batch = await asyncio.to_thread(c.submit, [{"seed": 1}, {"seed": 2}], env="calc", group_size=2,
                                        sampling={"temperature": 1.0, "max_tokens": 48}, max_turns=3)
        trajs = await asyncio.to_thread(lambda: list(c.iter_results(batch.id)))
    assert len(trajs) == 4
    vocab = 49152
    for t in trajs:
        assert t.failure is None and t.state in (TrajectoryState.completed, TrajectoryState.truncated)
        assert all(0 <= i < vocab for i in t.token_ids)
        assert len(t.token_ids) == len(t.logprobs) == len(t.loss_mask)
        sampled = [lp for lp, m in zip(t.logprobs, t.loss_mask) if m]
        assert sampled and all(math.isfinite(lp) and lp <= 1e-6 for lp in sampled)
        assert all(turn.engine_id == "vllm-0" and turn.policy_version == 0 for turn in t.turns)
        assert t.messages[2].role == "assistant" and t.messages[2].content  # decoded from the sampled ids


def perturbed_copy(src, dst) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    for f in dst.glob("*.safetensors"):
        tensors = load_file(f)
        g = torch.Generator().manual_seed(0)
        save_file({k: (v.float() + 0.05 * torch.randn(v.shape, generator=g)).to(v.dtype) if v.ndim == 2 else v
                   for k, v in tensors.items()}, f, metadata={"format": "pt"})


async def test_weight_update_through_the_service(vllm_server, gateway, redis, keys, tmp_path):
    reg = Registry(redis, keys)
    await reg.add_engine(EngineInfo(id="vllm-0", url=vllm_server.url, model=vllm_server.name,
                                    tokenizer=str(vllm_server.model_dir)))
    fleet = Fleet(registry=reg, refresh_s=0)
    greedy = dict(sampling=SamplingParams(temperature=0.0, max_tokens=16))
    before = await run_episode(work("math", "w0", **greedy), fleet, LocalEnvs())
    perturbed_copy(vllm_server.model_dir, tmp_path / "step-1")
    try:
        with RolloutClient(gateway.url, timeout=300) as c:
            res = await asyncio.to_thread(c.update_weights, path=str(tmp_path / "step-1"))
        assert res.version == 1 and res.results[0].ok, res
        after = await run_episode(work("math", "w1", **greedy), fleet, LocalEnvs())
        assert after.turns[0].policy_version == 1 and before.turns[0].policy_version == 0
        assert after.turns[0].output_ids != before.turns[0].output_ids  # new weights' output
    finally:  # leave the session's server on its original weights
        with RolloutClient(gateway.url, timeout=300) as c:
            back = await asyncio.to_thread(c.update_weights, path=str(vllm_server.model_dir))
        assert back.results[0].ok
    again = await run_episode(work("math", "w2", **greedy), fleet, LocalEnvs())
    assert again.turns[0].output_ids == before.turns[0].output_ids and again.turns[0].policy_version == 2
    await fleet.aclose()
