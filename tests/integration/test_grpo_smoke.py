"""Two GRPO steps through the real service (`rollout up --engine vllm`, SmolLM2 on CPU):
rollouts, a training step, new weights saved to a new folder and pushed; the policy version
advances and the engine's output changes. The full learning run is `python -m examples.grpo`."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.conftest import REDIS_URL

pytestmark = pytest.mark.integration
pytest.importorskip("torch")
pytest.importorskip("transformers")

from examples.grpo import trainer as grpo
from examples.grpo.__main__ import service
from examples.grpo.learner import Learner
from examples.grpo.tasks import TASKS

PROBE = TASKS["household"].make(123, 1)


async def _greedy(client, cfg):
    [t] = await grpo.rollouts(client, [PROBE], cfg, 1, {**cfg.sampling, "temperature": 0.0})
    return t.turns[0].output_ids, t.turns[0].output_logprobs, t.policy_versions


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_two_grpo_steps_move_the_engine(tmp_path, prefix, monkeypatch, mode):
    from rollout_service.local import vllm_local
    from trainer_client import AsyncRolloutClient

    monkeypatch.setenv("ROLLOUT_KEY_PREFIX", prefix)  # `rollout up` children inherit it
    # Tiny steps, a high learning rate (so that two steps surely show in bf16 weights), and the
    # household game: its graded format score (the share of valid commands) almost surely
    # differs inside a group of the base model (the calc bonus, all or nothing, once didn't).
    cfg = grpo.Config(out=tmp_path, task="household", mode=mode, steps=2, prompts=2, group_size=8, inflight=3,
                      max_tokens=12, max_turns=2, lr=1e-4, eval_tasks=0, redis_url=REDIS_URL, keep=5)

    async def run():
        folder = vllm_local.prepare_model("smollm2")
        learner = Learner(folder, cfg)
        with service(cfg) as url:
            async with AsyncRolloutClient(url, timeout=120.0) as client:
                start = await client.update_weights(path=str(folder))
                before = await _greedy(client, cfg)
                trainer = grpo.Trainer(client, learner, cfg)
                trainer.version = start.version
                for _ in range(3):  # a step whose groups all tie trains nothing: run more
                    await (trainer.run_async() if mode == "async" else trainer.run_sync())
                    if any(r.train["groups_trained"] for r in trainer.history):
                        break
                after = await _greedy(client, cfg)
                return start.version, before, after, trainer.history

    v0, before, after, history = asyncio.run(run())
    assert [r.version for r in history] == list(range(v0 + 1, v0 + 1 + len(history)))
    assert set(before[2]) == {v0} and set(after[2]) == {history[-1].version}
    assert any(r.train["groups_trained"] for r in history)
    assert all(r.trajectories == cfg.prompts * cfg.group_size for r in history)
    assert (tmp_path / f"step-{len(history)}" / "model.safetensors").exists()
    # the engine now serves the trained weights: same greedy prompt, different logprobs
    assert before[:2] != after[:2]
    assert json.loads(json.dumps([r.train for r in history]))
