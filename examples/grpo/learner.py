"""The policy being trained: SmolLM2 in fp32 on the CPU, one optimizer step per GRPO step."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from rollout_service.local import vllm_local
from wire import Trajectory

if TYPE_CHECKING:
    from examples.grpo.trainer import Config


class Learner:
    """The policy in fp32 (bf16 autocast for speed where the CPU computes bf16 natively: on an
    AVX2-only CPU autocast made a forward+backward 28x slower; pure bf16 weights would round most Adam
    updates away), one optimizer step per training step."""

    def __init__(self, folder: Path, cfg: Config):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        self.torch, self.cfg, self.folder = torch, cfg, folder
        self.bf16 = vllm_local.default_dtype() == "bfloat16"
        self.tok = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        self.model.config.use_cache = False
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, betas=(0.9, 0.99), weight_decay=0.0)

    def group_logprobs(self, prefix: list[int], suffixes: list[list[int]]):
        """log p of every suffix token given the shared prefix and the suffix before it: the
        prefix (a group's turn-0 prompt) goes through the model once, its KV cache is repeated
        for the members (gradients flow back through it)."""
        torch = self.torch
        b, s = len(suffixes), max(len(x) for x in suffixes)
        ids = torch.full((b, s), self.tok.pad_token_id or 0, dtype=torch.long)
        mask = torch.zeros((b, s), dtype=torch.long)
        for i, x in enumerate(suffixes):
            ids[i, :len(x)], mask[i, :len(x)] = torch.as_tensor(x), 1
        p = len(prefix)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            head = self.model(input_ids=torch.as_tensor([prefix]), use_cache=True, logits_to_keep=1)
            cache = head.past_key_values
            cache.batch_repeat_interleave(b)
            tail = self.model(input_ids=ids, attention_mask=torch.cat([torch.ones(b, p, dtype=torch.long), mask], 1),
                              past_key_values=cache, position_ids=(p + torch.arange(s))[None].expand(b, s),
                              use_cache=True)
        logits = torch.cat([head.logits[:, -1:].expand(b, 1, -1), tail.logits[:, :-1]], 1).float()
        if self.cfg.temperature != 1.0:
            logits = logits / self.cfg.temperature
        return torch.gather(logits, -1, ids[..., None]).squeeze(-1) - logits.logsumexp(-1), mask

    def step(self, trajs: list[Trajectory], advs: list[float | None]) -> dict:
        """One optimizer step on the members with an advantage; PPO-clipped ratio against the
        engine's logprobs (the behaviour policy, whatever version produced each token)."""
        torch = self.torch
        groups: dict[tuple[str, int], list[tuple[Trajectory, float]]] = {}
        for t, a in zip(trajs, advs):
            if a is not None:
                groups.setdefault((t.batch_id, t.group_index), []).append((t, a))
        n_tokens = sum(sum(len(turn.output_ids) for turn in t.turns) for g in groups.values() for t, _ in g)
        stats = {"groups_trained": len(groups), "tokens": n_tokens, "clip_frac": 0.0, "kl": 0.0, "loss": 0.0}
        if not groups:
            return stats
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        for members in groups.values():
            prefix = members[0][0].turns[0].prompt_ids
            rows, lps, lmask = [], [], []
            for t, _ in members:
                s = t.samples()[0]
                if s.token_ids[:len(prefix)] != prefix:
                    raise ValueError(f"{t.id}: turn-0 prompts differ inside a group")
                rows.append(s.token_ids[len(prefix):])
                lps.append(s.logprobs[len(prefix):])
                lmask.append(s.loss_mask[len(prefix):])
            new, _ = self.group_logprobs(prefix, rows)
            old = torch.zeros_like(new)
            m = torch.zeros_like(new)
            for i, (lp, lm) in enumerate(zip(lps, lmask)):
                old[i, :len(lp)], m[i, :len(lm)] = torch.as_tensor(lp), torch.as_tensor(lm, dtype=torch.float32)
            adv = torch.as_tensor([a for _, a in members])[:, None]
            log_ratio = (new - old) * m
            ratio = torch.exp(log_ratio)
            per_tok = -torch.minimum(ratio * adv, torch.clamp(ratio, 1 - self.cfg.clip, 1 + self.cfg.clip) * adv)
            loss = (per_tok * m).sum() / n_tokens
            loss.backward()
            with torch.no_grad():
                stats["loss"] += float(loss)
                stats["clip_frac"] += float((((ratio - 1).abs() > self.cfg.clip).float() * m).sum()) / n_tokens
                stats["kl"] += float(((ratio - 1 - log_ratio) * m).sum()) / n_tokens
        stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0))
        self.opt.step()
        return stats

    def save(self, out: Path) -> Path:
        """The weights in the engine's dtype (bf16 rounds most single steps away; the fp32
        master copy here keeps them), in a NEW folder (the engine's prefix cache and our old
        checkpoints must never see a half-written file), with the config and tokenizer."""
        from safetensors.torch import save_file

        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        tied = getattr(self.model.config, "tie_word_embeddings", False)
        dtype = self.torch.bfloat16 if self.bf16 else self.torch.float32
        state = {k: v.detach().to(dtype).contiguous() for k, v in self.model.state_dict().items()
                 if not (tied and k == "lm_head.weight")}
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        for f in self.folder.iterdir():
            if f.is_file() and f.suffix in (".json", ".jinja"):
                shutil.copy(f, tmp / f.name)
        os.chmod(tmp / "model.safetensors", 0o644)
        shutil.rmtree(out, ignore_errors=True)  # left by an earlier run into the same --out
        tmp.rename(out)
        return out
