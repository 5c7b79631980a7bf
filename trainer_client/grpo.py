"""GRPO on trajectories from the service: group-relative advantages, padded tensors, the loss.

A GRPO group is the trajectories of one task (`batch_id`, `group_index`). Each member's
advantage is its reward minus the group mean, over the group's standard deviation, computed
over the *usable* members only: a member that failed for an infrastructure reason
(`not traj.usable`) says nothing about the policy, so it is masked out (advantage None),
never counted as reward 0. A group whose usable rewards are all equal carries no signal
and is skipped too.

`pack` turns the rest into right-padded tensors, one row per training sample
(`traj.samples()`: one per trajectory unless a template rewrote a prefix), all aligned with
`input_ids`: the loss mask is 1 on sampled tokens only, and `old_logprobs` are the engine's
logprobs of those tokens (vLLM serves `processed_logprobs`: the distribution it sampled
from), so the importance ratio in `clipped_loss` needs no second forward pass.

    >>> from wire import Trajectory, Turn
    >>> def traj(i, reward, output_ids):
    ...     turn = Turn(index=0, prompt_ids=[1, 5, 6], output_ids=output_ids, output_logprobs=[-0.5] * len(output_ids),
    ...                 finish_reason="stop", policy_version=0, engine_id="e0")
    ...     return Trajectory(id=f"b-0-{i}", batch_id="b", group_index=0, sample_index=i, env="calc", task={},
    ...                       state="completed", turns=[turn], reward=reward)
    >>> group = [traj(0, 1.0, [7, 2]), traj(1, 0.0, [8]), traj(2, 0.0, [8, 8, 2]), traj(3, 1.0, [7, 2])]
    >>> advs = advantages(group)
    >>> [round(a, 3) for a in advs]
    [1.0, -1.0, -1.0, 1.0]
    >>> batch = pack(group, advs, pad_id=0)
    >>> batch.input_ids[:3].tolist()
    [[1, 5, 6, 7, 2, 0], [1, 5, 6, 8, 0, 0], [1, 5, 6, 8, 8, 2]]
    >>> batch.loss_mask[1].tolist(), batch.old_logprobs[1].tolist()
    ([0.0, 0.0, 0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, -0.5, 0.0, 0.0])

Then, in a training step (`model` a Hugging Face causal LM):

    new = token_logprobs(model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits,
                         batch.input_ids)
    loss, stats = clipped_loss(new, batch)
    loss.backward()

torch is imported inside the functions that build tensors, so `import trainer_client`
stays light. Non-goals: the optimizer, checkpointing, distributed training.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainer_client.tensors import as_torch
from wire import Trajectory
from wire.packed import PackedTrajectory

if TYPE_CHECKING:
    import torch


def group_key(traj: Trajectory) -> tuple[str, int]:
    return traj.batch_id, traj.group_index


def advantages(trajectories: Sequence[Trajectory | PackedTrajectory], eps: float = 1e-6, scale: bool = True,
               min_usable: int = 2) -> list[float | None]:
    """Per trajectory (same order): (reward - group mean) / (group std + eps), over usable
    members; None for members to leave out of the loss (unusable ones, and every member of a
    group with fewer than `min_usable` usable members or all-equal rewards).
    `scale=False` keeps the raw difference from the mean (Dr. GRPO)."""
    groups: dict[tuple[str, int], list[int]] = {}
    for i, t in enumerate(trajectories):
        if t.usable and t.reward is not None:
            groups.setdefault(group_key(t), []).append(i)
    out: list[float | None] = [None] * len(trajectories)
    for members in groups.values():
        rewards = [float(trajectories[i].reward) for i in members]  # type: ignore[arg-type]
        if len(members) < min_usable or max(rewards) == min(rewards):
            continue
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
        for i, r in zip(members, rewards):
            out[i] = (r - mean) / (std + eps) if scale else r - mean
    return out


def within_staleness(traj: Trajectory, version: int, max_staleness: int) -> bool:
    """True when every turn was produced by a policy at most `max_staleness` versions behind
    `version` (each turn records its own version, so a rollout that continued across a weight
    update is judged by its oldest turn)."""
    return all(version - turn.policy_version <= max_staleness for turn in traj.turns)


@dataclass(slots=True)
class Batch:
    """Right-padded training tensors, one row per training sample; every [rows, T] tensor is
    aligned with `input_ids` (column t describes token t)."""

    input_ids: "torch.Tensor"  # long [rows, T]
    attention_mask: "torch.Tensor"  # long [rows, T]
    loss_mask: "torch.Tensor"  # float [rows, T]: 1 where the engine sampled the token
    old_logprobs: "torch.Tensor"  # float [rows, T]: the engine's logprob of each sampled token, 0 elsewhere
    advantages: "torch.Tensor"  # float [rows]
    trajectory_ids: list[str]  # per row

    def __len__(self) -> int:
        return len(self.trajectory_ids)

    @property
    def tokens(self) -> int:
        return int(self.attention_mask.sum())

    def rows(self, index: Sequence[int]) -> "Batch":
        """A sub-batch (e.g. a micro-batch), trimmed to its own longest row."""
        import torch

        idx = torch.as_tensor(list(index), dtype=torch.long)
        width = max(int(self.attention_mask[idx].sum(1).max()), 1) if len(idx) else 1
        return Batch(self.input_ids[idx, :width], self.attention_mask[idx, :width], self.loss_mask[idx, :width],
                     self.old_logprobs[idx, :width], self.advantages[idx],
                     [self.trajectory_ids[i] for i in index])

    def micro_batches(self, max_tokens: int) -> list["Batch"]:
        """Rows grouped (sorted by length, so padding stays small) into sub-batches of at most
        `max_tokens` padded tokens each (a row longer than that gets a sub-batch of its own)."""
        lengths = self.attention_mask.sum(1).tolist()
        order = sorted(range(len(self)), key=lambda i: lengths[i])
        out: list[list[int]] = []
        for i in order:
            if out and (len(out[-1]) + 1) * lengths[i] <= max_tokens:
                out[-1].append(i)
            else:
                out.append([i])
        return [self.rows(ix) for ix in out]


def pack(trajectories: Sequence[Trajectory | PackedTrajectory], advs: Sequence[float | None], pad_id: int,
         max_len: int | None = None) -> Batch:
    """Tensors for the members whose advantage is not None (see `advantages`), one row per
    `traj.samples()` entry. `max_len` cuts rows (and their masks) to that many tokens."""
    import torch

    if len(trajectories) != len(advs):
        raise ValueError(f"{len(trajectories)} trajectories but {len(advs)} advantages")
    rows: list[tuple[Any, Any, Any, float, str]] = []
    for traj, adv in zip(trajectories, advs):
        if adv is None:
            continue
        for s in traj.samples():
            tok, m, lp = as_torch(s)  # either form: lists (JSON) or packed bytes (compact)
            if not bool(m.any()):
                continue
            n = len(tok) if max_len is None else min(len(tok), max_len)
            rows.append((tok[:n], m[:n], lp[:n], float(adv), traj.id))
    width = max((len(r[0]) for r in rows), default=0)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    att = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.float32)
    old = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, (tok, m, lp, _, _) in enumerate(rows):
        n = len(tok)
        ids[i, :n] = tok
        att[i, :n] = 1
        mask[i, :n] = m
        old[i, :n] = lp
    if width:
        mask[:, 0] = 0.0  # nothing predicts the first token
    return Batch(ids, att, mask, old, torch.as_tensor([r[3] for r in rows], dtype=torch.float32),
                 [r[4] for r in rows])


def token_logprobs(logits: "torch.Tensor", input_ids: "torch.Tensor", temperature: float = 1.0) -> "torch.Tensor":
    """log p(token t | tokens < t) for every position, aligned with `input_ids` (column 0 is 0).
    `temperature` must match the sampling temperature for the ratio against the engine's
    processed logprobs to mean anything."""
    import torch

    logits = logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    picked = torch.gather(logits, -1, input_ids[:, 1:, None]).squeeze(-1)
    lp = picked - torch.logsumexp(logits, dim=-1)
    return torch.nn.functional.pad(lp, (1, 0))


def clipped_loss(new_logprobs: "torch.Tensor", batch: Batch, clip: float = 0.2, clip_high: float | None = None,
                 normalizer: float | None = None) -> tuple["torch.Tensor", dict[str, Any]]:
    """PPO-clipped policy-gradient loss against the engine's logprobs, summed over sampled
    tokens and divided by `normalizer` (default: this batch's sampled tokens; pass the whole
    step's count when accumulating over micro-batches). Returns (loss, stats)."""
    import torch

    mask = batch.loss_mask
    # Where the mask is 0 the old logprob is 0 by construction; zero the difference there
    # so exp() never sees a huge value from a padded position.
    log_ratio = (new_logprobs - batch.old_logprobs) * mask
    ratio = torch.exp(log_ratio)
    adv = batch.advantages[:, None]
    hi = 1.0 + (clip if clip_high is None else clip_high)
    per_token = -torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - clip, hi) * adv)
    n = float(mask.sum()) if normalizer is None else normalizer
    loss = (per_token * mask).sum() / max(n, 1.0)
    with torch.no_grad():
        sampled = mask.sum().clamp(min=1.0)
        clipped = ((ratio < 1.0 - clip) | (ratio > hi)).float()
        stats = {"tokens": int(mask.sum()), "clip_frac": float((clipped * mask).sum() / sampled),
                 # k3 estimator of KL(behaviour || current), on sampled tokens
                 "kl": float(((ratio - 1.0 - log_ratio) * mask).sum() / sampled)}
    return loss, stats


__all__ = ["Batch", "advantages", "clipped_loss", "group_key", "pack", "token_logprobs", "within_staleness"]
