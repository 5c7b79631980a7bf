"""TRL's real `GRPOTrainer` (trl from PyPI) trains two steps with its rollouts from the service
through `trainer_client.trl.ServiceRollout`: groups of `num_generations`, the env's reward,
exact ids and logprobs, and the new weights pushed to the engine between the steps.

The policy is the packaged 5M-parameter Llama and the engine the simulated one (its byte
tokenizer's ids are valid ids of that model): this checks the plumbing, not learning."""

from __future__ import annotations

import redis as syncredis
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from rollout_service.engines.sim import SimEngine
from rollout_service.engines.sim_server import create_app as sim_app
from rollout_service.local import vllm_local
from tests.conftest import REDIS_URL, LiveServer, RunningWorker
from trainer_client import RolloutClient
from trainer_client.trl import ServiceRollout, env_reward
from wire import EngineInfo


class Recording(ServiceRollout):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.calls: list[tuple[list, dict]] = []

    def __call__(self, prompts, trainer):
        out = super().__call__(prompts, trainer)
        self.calls.append((list(prompts), out))
        return out


def brevity(completion_ids: list, **_) -> list[float]:
    """A second reward, shorter is better: GRPO's advantages are zero in a group whose rewards are
    all equal (four wrong answers are common), and then no step changes a weight. The simulated
    policy's answers differ in length, so with this the gradient is non-zero (checked below)."""
    return [-len(c) / 100 for c in completion_ids]


def test_two_steps_of_trls_grpo_trainer_through_the_service(gateway, settings, keys, tmp_path, monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    srv = LiveServer(sim_app(SimEngine("sim", seed=1))).__enter__()
    syncredis.Redis.from_url(REDIS_URL).hset(keys.engines, "sim", EngineInfo(id="sim", url=srv.url).model_dump_json())
    path = vllm_local.model_dir("tiny")
    model, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rollout = Recording(gateway.url, env="math", task=lambda p: {"seed": int(p)}, weights_dir=tmp_path / "pushed")
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4, max_steps=2,
                      max_completion_length=48, learning_rate=1e-2, temperature=1.0, logging_steps=1, report_to=[],
                      save_strategy="no", use_cpu=True, bf16=False, seed=0)
    try:
        with RunningWorker(settings, discover=True):
            trainer = GRPOTrainer(model=model, processing_class=tok, args=args, reward_funcs=[env_reward, brevity],
                                  train_dataset=Dataset.from_dict({"prompt": ["11", "12", "13", "14"]}),
                                  rollout_func=rollout)
            trainer.train()
    finally:
        rollout.close()
        srv.__exit__()
    assert len(rollout.calls) == 2
    with RolloutClient(gateway.url) as c:
        for step, (prompts, out) in enumerate(rollout.calls):
            assert len(prompts) == 4 and len(set(prompts)) == 1  # one prompt, num_generations times
            assert all(len(out[k]) == 4 for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask", "env_reward"))
            for tid, p, comp, lps, mask, reward in zip(out["trajectory_id"], out["prompt_ids"], out["completion_ids"],
                                                       out["logprobs"], out["env_mask"], out["env_reward"]):
                t = c.trajectory(tid)
                assert t.env == "math" and t.task == {"seed": int(prompts[0])}
                (turn,) = t.turns  # math is single-turn: the completion is the sampled ids, exactly
                assert (p, comp, lps, mask) == (turn.prompt_ids, turn.output_ids, turn.output_logprobs,
                                                [1] * len(comp))
                assert reward == t.reward and reward in (0.0, 1.0)
                assert turn.policy_version == step  # step 2 sampled from the weights step 1 pushed
    assert (tmp_path / "pushed" / "step-1" / "config.json").exists()
    rewards = [h["rewards/env_reward/mean"] for h in trainer.state.log_history if "rewards/env_reward/mean" in h]
    assert len(rewards) == 2
    # The trainer stepped on the service's rollouts: some group had rewards to tell apart (the
    # lengths differ), so its advantages, the gradient and the weights moved.
    assert any(len({len(c) for c in out["completion_ids"]}) > 1 for _, out in rollout.calls)
    after = trainer.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
