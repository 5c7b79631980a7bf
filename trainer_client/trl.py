"""TRL's `GRPOTrainer` with its rollouts from this service: a `rollout_func`.

TRL (checked with trl 1.16.0) calls `rollout_func(prompts, trainer)` on each process with that
process's prompts, each repeated `num_generations` times in a row, and wants back, per entry,
`prompt_ids`, `completion_ids` and `logprobs` (the sampler's, per completion token); any
other key is handed to the reward functions, and `env_mask` marks which completion tokens the
model sampled (1) and which an environment wrote (0). `ServiceRollout` is that function:

    from trl import GRPOConfig, GRPOTrainer
    from trainer_client.trl import ServiceRollout, env_reward

    rollout = ServiceRollout("http://127.0.0.1:8000", env="math", task=lambda p: {"seed": int(p)},
                             weights_dir="ckpt/pushed")
    trainer = GRPOTrainer(model=..., args=GRPOConfig(num_generations=4, ...), train_dataset=ds,
                          reward_funcs=[env_reward], rollout_func=rollout)

Each run of equal prompts becomes one task of a batch, its group size the run's length (a
GRPO group); `task(prompt)` says what the env gets (default: `{"prompt": prompt}`). Sampling
follows the trainer's arguments (temperature, top_p, top_k, max_completion_length). A
trajectory's first prompt is `prompt_ids`; everything after it (sampled turns and the env's
observations between them) is the completion, with `env_mask` 0 on the observations and
logprobs 0.0 there. The env's reward comes as the `env_reward` column (`env_reward` the
reward function that reads it); a trajectory that failed for an infrastructure reason gets
None (TRL leaves it out of the group statistics) and, if it has no tokens, a completion of
the tokenizer's eos alone.

With `weights_dir`, once the trainer has taken an optimizer step, the policy is saved under
`weights_dir/step-N` and pushed to every engine (`update_weights`) before the next rollouts,
so samples come from the weights being trained; the engines must be able to read that folder.

Non-goals: the training loop (TRL's); several training samples per trajectory (a chat
template that rewrites history): the first one is used.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from trainer_client._client import RolloutClient
from wire import Trajectory


def env_reward(completions: list, env_reward: list[float | None], **_: Any) -> list[float | None]:
    """A TRL reward function: the env's reward of each rollout (None: leave it out)."""
    return list(env_reward)


def _runs(prompts: list) -> list[tuple[Any, int]]:
    """(prompt, how many times in a row): TRL repeats each prompt num_generations times."""
    runs: list[tuple[Any, int]] = []
    for p in prompts:
        if runs and runs[-1][0] == p:
            runs[-1] = (p, runs[-1][1] + 1)
        else:
            runs.append((p, 1))
    return runs


def as_completion(traj: Trajectory, eos_id: int) -> dict[str, Any]:
    """One trajectory in TRL's terms: prompt ids, then everything after as the completion."""
    sample = traj.samples()[0] if traj.turns else None
    if sample is None:
        return {"prompt_ids": [eos_id], "completion_ids": [eos_id], "logprobs": [0.0], "env_mask": [0]}
    n = len(traj.turns[0].prompt_ids)
    return {"prompt_ids": sample.token_ids[:n], "completion_ids": sample.token_ids[n:],
            "logprobs": sample.logprobs[n:], "env_mask": sample.loss_mask[n:]}


class ServiceRollout:
    """`rollout_func` for TRL's GRPOTrainer, backed by the rollout service (see the module)."""

    def __init__(self, base_url: str, env: str, task: Callable[[Any], dict[str, Any]] | None = None,
                 api_key: str | None = None, weights_dir: str | os.PathLike | None = None,
                 timeout_s: float = 3600.0, **batch: Any):
        """`batch`: more of the batch request (max_turns, max_total_tokens, deadline_s...)."""
        self.client = RolloutClient(base_url, api_key=api_key)
        self.env, self.batch, self.timeout_s = env, batch, timeout_s
        self.task = task or (lambda prompt: {"prompt": prompt})
        self.weights_dir = os.fspath(weights_dir) if weights_dir is not None else None
        self._pushed_step = 0  # the step whose weights the engines serve (0: the ones they started with)

    def sampling(self, trainer) -> dict[str, Any]:
        a = trainer.args
        s: dict[str, Any] = {"temperature": a.temperature, "max_tokens": a.max_completion_length}
        if getattr(a, "top_p", None) is not None:
            s["top_p"] = a.top_p
        if getattr(a, "top_k", None) not in (None, 0):
            s["top_k"] = a.top_k
        return s

    def push_weights(self, trainer) -> None:
        """Save the policy being trained and move the engines to it, once per optimizer step."""
        step = trainer.state.global_step
        if self.weights_dir is None or step == self._pushed_step:
            return
        path = os.path.join(self.weights_dir, f"step-{step}")
        model = trainer.accelerator.unwrap_model(trainer.model)
        if trainer.accelerator.is_main_process:
            model.save_pretrained(path)
            trainer.processing_class.save_pretrained(path)
            self.client.update_weights(path, version=step)
        trainer.accelerator.wait_for_everyone()
        self._pushed_step = step

    def __call__(self, prompts: list, trainer) -> dict[str, list]:
        self.push_weights(trainer)
        eos = trainer.processing_class.eos_token_id
        runs = _runs(prompts)
        # One batch per run length (all equal to num_generations unless a group was split
        # across processes): a batch has one group size.
        by_size: dict[int, list[int]] = {}
        for i, (_, n) in enumerate(runs):
            by_size.setdefault(n, []).append(i)
        got: dict[int, list[Trajectory]] = {}
        for size, idx in by_size.items():
            created = self.client.submit([self.task(runs[i][0]) for i in idx], env=self.env, group_size=size,
                                         sampling=self.sampling(trainer), **self.batch)
            self.client.wait(created.id, timeout=self.timeout_s)
            trajs = sorted(self.client.trajectories(created.id), key=lambda t: (t.group_index, t.sample_index))
            for g, i in enumerate(idx):
                got[i] = [t for t in trajs if t.group_index == g]
        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [],
                                "env_reward": [], "trajectory_id": []}
        for i in range(len(runs)):
            for t in got[i]:
                for k, v in as_completion(t, eos).items():
                    out[k].append(v)
                out["env_reward"].append(t.reward if t.usable else None)
                out["trajectory_id"].append(t.id)
        return out

    def close(self) -> None:
        self.client.close()
