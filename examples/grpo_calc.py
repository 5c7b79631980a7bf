"""GRPO through rollout-service: SmolLM2-135M-Instruct learns to use the calculator tool.

    python examples/grpo_calc.py                        # starts `rollout up --engine vllm`, trains 30 steps
    python examples/grpo_calc.py --mode async --max-staleness 1
    python examples/grpo_calc.py --mode compare --steps 4 # sync vs async wall time, same steps
    python examples/grpo_calc.py --url http://127.0.0.1:8000   # a running service on this machine

Every rollout comes from the service (vLLM on CPU, the `calc` env): the trainer submits
groups, trains on the exact tokens and the engine's logprobs they carry, saves the weights
to a new folder `OUT/step-N` and pushes them with `update_weights(path=...)`, so the policy
version advances and later turns record it. Held-out success (seeds never trained on) is
measured before and after; the reward curve goes to `OUT/reward.png`, every figure to
`OUT/history.json`.

The task: the generated word problems of the `calc` env (add, subtract, multiply), each
question preceded by one worked example of the two-turn exchange (`calc: 3 * 4` ->
`result: 12` -> `answer: 12`). Sampling stops at a newline, so every action is one line.

Modes:
- sync: submit a step's groups, wait for all, train, push weights, repeat.
- async: keep `--inflight` groups running at all times (continuous refill); a step trains as
  soon as `--prompts` complete groups are in (early stop; the rest carry over); a member
  with a turn more than `--max-staleness` policy versions old is masked; rollouts in
  flight during a weight update are not restarted: they continue on the new weights
  (their turns then carry different versions).

Measured on a 2-core CPU machine (defaults; 8 groups x 8 per step; vLLM and the trainer
sharing the cores): held-out success (64 fresh seeds, sampled at T=1) 0.00 before, 1.00
after 30 steps (greedy 0.98); 774 s of training wall time, train success crossing 0.6 at
step 15 (~8 min). `--mode compare --steps 6`: sync 206 s, async 265 s (on 2 cores the
overlap only adds contention: training slows while rollouts keep running).

Needs torch and transformers (the `engine` extra) and matplotlib for the plot.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from env_workers.envs.problems import word_problem  # noqa: E402
from rollout_service.protocol import Trajectory  # noqa: E402
from trainer_client import AsyncRolloutClient  # noqa: E402
from trainer_client.grpo import advantages, within_staleness  # noqa: E402

EXAMPLE = ("Example:\nQuestion: Ben has 3 boxes with 4 cards in each. How many cards are there in all?\n"
           "You: calc: 3 * 4\nCalculator: result: 12\nYou: answer: 12\n\nQuestion: ")
HELD_OUT_BASE = 10**9  # held-out seeds start here; training seeds are drawn below 10**8


@dataclass(slots=True)
class Config:
    url: str | None = None
    out: Path = Path("/tmp/grpo_calc")
    mode: str = "sync"
    steps: int = 30
    prompts: int = 8  # groups per step
    group_size: int = 8
    inflight: int = 12  # async: groups kept running
    max_staleness: int = 1  # async: policy versions a turn may lag behind
    lr: float = 2e-5
    clip: float = 0.2
    temperature: float = 1.0
    max_tokens: int = 24
    max_turns: int = 3
    eval_tasks: int = 64
    eval_greedy: bool = False
    seed: int = 0
    threads: int = 2
    keep: int = 2  # checkpoints kept on disk
    # Added to the env's reward for the whole format (a tool call, then an answer). With the env's
    # reward alone, 64 rollouts of the base model had no success at all: no signal.
    format_bonus: float = 0.2
    redis_url: str | None = None

    @property
    def sampling(self) -> dict:
        return {"temperature": self.temperature, "max_tokens": self.max_tokens, "stop": ["\n"]}


def well_formed(t: Trajectory) -> bool:
    """A successful tool call, then an answer (the env ends an episode only on an answer).
    Rewarding the tool call alone teaches the model to call it forever."""
    called = any(m.role == "user" and m.content.startswith("result:") for m in t.messages)
    return called and t.state.value == "completed"


def task(seed: int) -> dict:
    p = word_problem(seed)
    return {"question": EXAMPLE + p["question"], "answer": p["answer"]}


# ----------------------------------------------------------------------------- the learner

class Learner:
    """The policy in fp32 (bf16 autocast for speed: pure bf16 weights would round most Adam
    updates away), one optimizer step per training step."""

    def __init__(self, folder: Path, cfg: Config):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        self.torch, self.cfg, self.folder = torch, cfg, folder
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
        with torch.autocast("cpu", dtype=torch.bfloat16):
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
            new, att = self.group_logprobs(prefix, rows)
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
        """bf16 weights in a NEW folder (the engine's prefix cache and our old checkpoints
        must never see a half-written file), with the config and tokenizer beside them."""
        from safetensors.torch import save_file

        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        tied = getattr(self.model.config, "tie_word_embeddings", False)
        state = {k: v.detach().to(self.torch.bfloat16).contiguous() for k, v in self.model.state_dict().items()
                 if not (tied and k == "lm_head.weight")}
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        for f in self.folder.iterdir():
            if f.is_file() and f.suffix in (".json", ".jinja"):
                shutil.copy(f, tmp / f.name)
        os.chmod(tmp / "model.safetensors", 0o644)
        shutil.rmtree(out, ignore_errors=True)  # left by an earlier run into the same --out
        tmp.rename(out)
        return out


# ----------------------------------------------------------------------------- rollouts

async def rollouts(client: AsyncRolloutClient, tasks: list[dict], cfg: Config, group_size: int,
                   sampling: dict | None = None) -> list[Trajectory]:
    batch = await client.submit(tasks, env="calc", group_size=group_size, sampling=sampling or cfg.sampling,
                                max_turns=cfg.max_turns)
    return [t async for t in client.iter_results(batch.id)]


async def held_out(client: AsyncRolloutClient, cfg: Config, greedy: bool = False) -> float:
    tasks = [task(HELD_OUT_BASE + i) for i in range(cfg.eval_tasks)]
    sampling = {**cfg.sampling, "temperature": 0.0} if greedy else cfg.sampling
    trajs = await rollouts(client, tasks, cfg, 1, sampling)
    usable = [t for t in trajs if t.usable]
    return sum(t.reward == 1.0 for t in usable) / max(len(usable), 1)


@dataclass(slots=True)
class StepRecord:
    step: int
    version: int
    reward: float
    success: float
    trajectories: int
    masked_failed: int
    masked_stale: int
    spanning_versions: int
    rollout_s: float
    train_s: float
    update_s: float
    wall_s: float
    well_formed: float = 0.0  # tool call, then an answer
    train: dict = field(default_factory=dict)


class Trainer:
    def __init__(self, client: AsyncRolloutClient, learner: Learner, cfg: Config):
        self.client, self.learner, self.cfg = client, learner, cfg
        self.rng = random.Random(cfg.seed)
        self.version = 0
        self.history: list[StepRecord] = []
        self.t0 = time.monotonic()

    def next_task(self) -> dict:
        return task(self.rng.randrange(10**8))

    async def train_and_push(self, step: int, trajs: list[Trajectory], rollout_s: float, stale: set[str]) -> None:
        cfg = self.cfg
        # Stale members leave the group entirely: they count neither in its statistics nor in the loss.
        fresh = [t for t in trajs if t.id not in stale]
        env_reward = {t.id: t.reward or 0.0 for t in trajs}
        if cfg.format_bonus:
            for t in fresh:
                if t.usable and t.reward is not None:
                    t.reward += cfg.format_bonus * well_formed(t)
        t1 = time.monotonic()
        stats = await asyncio.to_thread(self.learner.step, fresh, advantages(fresh))
        t2 = time.monotonic()
        folder = self.learner.save(cfg.out / f"step-{step}")
        result = await self.client.update_weights(path=str(folder))
        if result.version <= self.version:
            raise RuntimeError(f"policy version did not advance: {self.version} -> {result.version}")
        self.version = result.version
        old = cfg.out / f"step-{step - cfg.keep}"
        if step - cfg.keep >= 1 and old.exists():
            shutil.rmtree(old)
        usable = [t for t in trajs if t.usable]
        rec = StepRecord(step, self.version, sum(env_reward[t.id] for t in usable) / max(len(usable), 1),
                         sum(env_reward[t.id] == 1.0 for t in usable) / max(len(usable), 1), len(trajs),
                         sum(1 for t in trajs if not t.usable and t.id not in stale), len(stale),
                         sum(1 for t in trajs if len(set(t.policy_versions)) > 1),
                         rollout_s, t2 - t1, time.monotonic() - t2, time.monotonic() - self.t0,
                         sum(map(well_formed, usable)) / max(len(usable), 1), stats)
        self.history.append(rec)
        print(f"step {step:3d}  v{rec.version}  success {rec.success:.3f}  well-formed {rec.well_formed:.2f}  groups {stats['groups_trained']}/"
              f"{len(trajs) // cfg.group_size}  masked {rec.masked_failed}+{rec.masked_stale} stale  "
              f"spanning {rec.spanning_versions}  kl {stats['kl']:.4f}  clip {stats['clip_frac']:.3f}  "
              f"rollout {rollout_s:.0f}s train {rec.train_s:.0f}s update {rec.update_s:.1f}s  "
              f"wall {rec.wall_s:.0f}s", flush=True)

    async def run_sync(self) -> None:
        first = len(self.history) + 1
        for step in range(first, first + self.cfg.steps):
            t0 = time.monotonic()
            trajs = await rollouts(self.client, [self.next_task() for _ in range(self.cfg.prompts)], self.cfg,
                                   self.cfg.group_size)
            await self.train_and_push(step, trajs, time.monotonic() - t0, set())

    async def run_async(self) -> None:
        cfg = self.cfg
        done: asyncio.Queue[list[Trajectory] | BaseException] = asyncio.Queue()
        running: dict[asyncio.Task, str | None] = {}  # group task -> its batch id, once submitted
        refilling = True

        async def one_group() -> None:
            # One batch per group, so a group is usable the moment its own members finish.
            me = asyncio.current_task()
            try:
                batch = await self.client.submit([self.next_task()], env="calc", group_size=cfg.group_size,
                                                  sampling=cfg.sampling, max_turns=cfg.max_turns)
                running[me] = batch.id
                done.put_nowait([t async for t in self.client.iter_results(batch.id)])
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 (re-raised by the step loop)
                done.put_nowait(e)

        def finished(task: asyncio.Task) -> None:
            running.pop(task, None)
            refill()  # continuous refill, also while a step trains

        def refill() -> None:
            while refilling and len(running) < cfg.inflight:
                t = asyncio.create_task(one_group())
                running[t] = None
                t.add_done_callback(finished)

        ready: list[list[Trajectory]] = []
        try:
            refill()
            first = len(self.history) + 1
            for step in range(first, first + cfg.steps):
                t0 = time.monotonic()
                while len(ready) < cfg.prompts:  # early stop: train once enough usable groups are in
                    got = await asyncio.wait_for(done.get(), timeout=1800)
                    if isinstance(got, BaseException):
                        raise got
                    if sum(t.usable for t in got) >= 2:
                        ready.append(got)
                groups, ready = ready[:cfg.prompts], ready[cfg.prompts:]
                trajs = [t for g in groups for t in g]
                stale = {t.id for t in trajs if t.usable and not within_staleness(t, self.version, cfg.max_staleness)}
                # Rollouts keep running while this step trains; the weight update freezes them
                # (`pause?mode=keep`) and they continue on the new weights, never restarted.
                await self.train_and_push(step, trajs, time.monotonic() - t0, stale)
        finally:
            refilling = False
            batches = [b for b in running.values() if b]
            for t in list(running):
                t.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            for b in batches:  # leftover rollouts: stop them on the service too
                with contextlib.suppress(Exception):
                    await self.client.cancel(b)


# ----------------------------------------------------------------------------- the service

@contextlib.contextmanager
def service(cfg: Config) -> Iterator[str]:
    """`rollout up --engine vllm` as a child process (or the given --url)."""
    if cfg.url:
        yield cfg.url
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, "-m", "rollout_service.cli", "up", "--engine", "vllm", "--port", str(port)]
    if cfg.redis_url:
        argv += ["--redis-url", cfg.redis_url]
    log = open(cfg.out / "up.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            cwd=Path(__file__).resolve().parents[1])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"rollout up exited:\n{(cfg.out / 'up.log').read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise SystemExit("rollout up not ready after 600 s")
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200 and \
                        httpx.get(f"{url}/v1/workers", timeout=2).json():
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # `rollout up` stops its children on SIGTERM
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def plot(history: list[StepRecord], before: float, after: float, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r.step for r in history], [r.success for r in history], marker="o", label="train success (sampled)")
    ax.plot([r.step for r in history], [r.well_formed for r in history], ls="--", label="calc, then answer")
    last = history[-1].step if history else 0
    ax.scatter([0, last], [before, after], color="red", zorder=3, label="held-out success")
    ax.set_xlabel("step")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


async def main_async(cfg: Config) -> dict:
    from rollout_service.engines import vllm_local

    folder = vllm_local.prepare_model("smollm2")
    learner = Learner(folder, cfg)
    with service(cfg) as url:
        async with AsyncRolloutClient(url, timeout=120.0) as client:
            start = await client.update_weights(path=str(folder))  # a known starting point
            t0 = time.monotonic()
            before = await held_out(client, cfg) if cfg.eval_tasks else float("nan")
            eval_s = time.monotonic() - t0
            print(f"held-out success before: {before:.3f}  ({cfg.eval_tasks} tasks, {eval_s:.0f}s)", flush=True)
            trainer = Trainer(client, learner, cfg)
            trainer.version = start.version
            trainer.t0 = time.monotonic()
            await (trainer.run_async() if cfg.mode == "async" else trainer.run_sync())
            train_wall = time.monotonic() - trainer.t0
            after = await held_out(client, cfg) if cfg.eval_tasks else float("nan")
            greedy = await held_out(client, cfg, greedy=True) if cfg.eval_greedy else None
    total = time.monotonic() - t0
    print(f"held-out success after {cfg.steps} steps: {after:.3f}" + (f"  (greedy {greedy:.3f})" if greedy is not None
                                                                         else ""))
    print(f"mode {cfg.mode}: {cfg.steps} steps in {train_wall:.0f} s of training wall time "
          f"({total:.0f} s with both evaluations)")
    summary = {"config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()},
               "before": before, "after": after, "greedy_after": greedy, "train_wall_s": train_wall,
               "total_s": total, "history": [asdict(r) for r in trainer.history]}
    (cfg.out / "history.json").write_text(json.dumps(summary, indent=1))
    plot(trainer.history, before, after, cfg.out / "reward.png")
    return summary


async def compare(cfg: Config) -> dict:
    """The same number of steps in sync and then async mode, each from the original weights
    with a fresh optimizer, on one service; wall times side by side (no evaluation)."""
    from rollout_service.engines import vllm_local

    folder = vllm_local.prepare_model("smollm2")
    walls: dict[str, float] = {}
    histories: dict[str, list[StepRecord]] = {}
    with service(cfg) as url:
        async with AsyncRolloutClient(url, timeout=120.0) as client:
            for mode in ("sync", "async"):
                run = replace(cfg, mode=mode, out=cfg.out / mode)
                run.out.mkdir(parents=True, exist_ok=True)
                start = await client.update_weights(path=str(folder))
                trainer = Trainer(client, Learner(folder, run), run)
                trainer.version = start.version
                print(f"-- {mode}", flush=True)
                trainer.t0 = time.monotonic()
                await (trainer.run_async() if mode == "async" else trainer.run_sync())
                walls[mode], histories[mode] = time.monotonic() - trainer.t0, trainer.history
    print(f"\n{'':24}{'sync':>10}{'async':>10}")
    print(f"{'steps':24}{cfg.steps:>10}{cfg.steps:>10}")
    print(f"{'wall time (s)':24}{walls['sync']:>10.0f}{walls['async']:>10.0f}")
    for label, key in (("waiting for rollouts (s)", "rollout_s"), ("training (s)", "train_s"),
                       ("weight updates (s)", "update_s")):
        print(f"{label:24}" + "".join(f"{sum(getattr(r, key) for r in histories[m]):>10.0f}" for m in walls))
    print(f"{'mean train success':24}" + "".join(
        f"{sum(r.success for r in histories[m]) / max(len(histories[m]), 1):>10.3f}" for m in walls))
    print(f"{'masked stale members':24}" + "".join(f"{sum(r.masked_stale for r in histories[m]):>10}" for m in walls))
    print(f"{'spanning >1 version':24}" + "".join(f"{sum(r.spanning_versions for r in histories[m]):>10}"
                                                    for m in walls))
    print(f"async/sync wall time: {walls['async'] / walls['sync']:.2f}")
    out = {"walls": walls, "history": {m: [asdict(r) for r in h] for m, h in histories.items()}}
    (cfg.out / "compare.json").write_text(json.dumps(out, indent=1))
    return out


def parse(argv: list[str] | None = None) -> Config:
    d = Config()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="a running service (default: start `rollout up --engine vllm`)")
    ap.add_argument("--redis-url", help="with no --url: the Redis `rollout up` uses (default: embedded)")
    ap.add_argument("--out", type=Path, default=d.out, help=f"checkpoints, history, plot (default {d.out})")
    ap.add_argument("--mode", choices=["sync", "async", "compare"], default=d.mode,
                    help="compare: --steps in sync, then in async mode; wall times side by side")
    for name in ("steps", "prompts", "group_size", "inflight", "max_staleness", "max_tokens", "max_turns",
                 "eval_tasks", "seed", "threads", "keep"):
        ap.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(d, name))
    for name in ("lr", "clip", "temperature", "format_bonus"):
        ap.add_argument("--" + name.replace("_", "-"), type=float, default=getattr(d, name))
    ap.add_argument("--eval-greedy", action="store_true", help="also measure greedy held-out success at the end")
    a = ap.parse_args(argv)
    cfg = Config(**{k: v for k, v in vars(a).items()})
    cfg.out.mkdir(parents=True, exist_ok=True)
    return cfg


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt  # so that SIGTERM stops `rollout up` too (the `service` context exits)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _interrupt)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    config = parse()
    asyncio.run(compare(config) if config.mode == "compare" else main_async(config))
