"""GRPO through rollout-service: SmolLM2-135M-Instruct learns a tool, a household game, or a reasoning-gym task.

    python -m examples.grpo                                  # calc: starts `rollout up --engine vllm`, 30 steps
    python -m examples.grpo --task household --eval-every 4 --target 0.95   # the textworld game, level 1
    python -m examples.grpo --mode async --max-staleness 1
    python -m examples.grpo --mode compare --steps 4         # sync vs async wall time, same steps
    python -m examples.grpo --task rg-chain_sum --steps 40   # a reasoning-gym generator
    python -m examples.grpo --url http://127.0.0.1:8000      # a running service on this machine

(run from the repository root). Every rollout comes from the service (vLLM on CPU, an env
of the catalog): the trainer submits groups, trains on the exact tokens and the engine's
logprobs they carry, saves the weights to a new folder `OUT/step-N` and pushes them with
`update_weights(path=...)`, so the policy version advances and later turns record it.
Held-out success (seeds never trained on) is measured before and after; the reward curve
goes to `OUT/reward.png`, every figure to `OUT/history.json`.

Tasks (`tasks.py`):
- calc: the generated word problems of the `calc` env (add, subtract, multiply), each
  preceded by one worked example of the two-turn exchange (`calc: 3 * 4` -> `result: 12`
  -> `answer: 12`). Sampling stops at a newline, so every action is one line.
- household: the `textworld` game at `--level` (1: one room, the object in sight, two
  commands win; 2: one room with closed receptacles; 3: the house), up to 6 commands.
- rg-NAME: a reasoning-gym generator (`tasks.RG_TASKS`: small configs), one answer in
  `<answer></answer>` tags scored by the generator's own scorer, after two worked examples of
  the generator as earlier chat turns. `python -m examples.grpo.probe` measures the base model
  on each; rg-chain_sum (a ± b, one digit): held-out 0.078 -> 0.641 in 40 steps (README).

Modes: see `trainer.py` (sync; async with continuous refill, a per-turn staleness bound,
partial rollouts across weight updates and early stop).

Measured on a 2-core CPU machine (defaults; 8 groups x 8 per step; vLLM and the trainer
sharing the cores), calc: held-out success (64 fresh seeds, sampled at T=1) 0.00 before,
1.00 after 30 steps (greedy 0.98); 774 s of training wall time, train success crossing
0.6 at step 15 (~8 min). `--mode compare --steps 6`: sync 206 s, async 265 s (on 2 cores
the overlap only adds contention: training slows while rollouts keep running).

Household (level 1, the task's defaults: 6 groups x 8 per step, lr 5e-5; `--eval-every 4
--target 0.95`): held-out success (48 fresh games, sampled at T=1) 0.000 before, 0.146 at step
4, 0.583 at step 8, 0.979 at step 12 (greedy 1.000), 974 s of training wall time; a first run
with the same settings reached 0.958 at step 12 (17 min). What made it learnable: the worked
example given as earlier chat turns (as text in the first observation the base model narrated
outcomes, "You put a towel in the bed.", instead of typing commands) and a format score that
pays for picking up the goal's object (paying for valid commands alone collapsed the policy
onto valid moves that went nowhere). Figures: `docs/results/grpo-household-level1.*`.
Level 2 (`--level 2 --max-turns 6 --max-minutes 25`): 0.000 -> 0.104 (step 8) -> 0.167 after
13 steps (25 min; ~190 s per early step), still rising.

Needs torch and transformers (the `engine` extra) and matplotlib for the plot.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path

import httpx

from examples.grpo.learner import Learner
from examples.grpo.tasks import TASKS
from examples.grpo.trainer import TASK_DEFAULTS, Config, StepRecord, Trainer, held_out
from trainer_client import AsyncRolloutClient

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


def plot(history: list[StepRecord], before: float, after: float, path: Path, cfg: Config) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r.step for r in history], [r.success for r in history], marker="o", label="train success (sampled)")
    ax.plot([r.step for r in history], [r.well_formed for r in history], ls="--", label=cfg.spec.well_formed_label)
    last = history[-1].step if history else 0
    evals = [(0, before)] + [(r.step, r.held_out) for r in history if r.held_out is not None] + [(last, after)]
    ax.plot(*zip(*evals), color="red", marker="s", zorder=3, label="held-out success")
    ax.set_title(f"GRPO through rollout-service: {cfg.task}" + (f" (level {cfg.level})" if cfg.task == "household"
                                                               else ""))
    ax.set_xlabel("step")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


async def main_async(cfg: Config) -> dict:
    from rollout_service.local import vllm_local

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
    print(f"held-out success after {len(trainer.history)} steps: {after:.3f}" + (f"  (greedy {greedy:.3f})" if greedy is not None
                                                                         else ""))
    print(f"mode {cfg.mode}: {len(trainer.history)} steps in {train_wall:.0f} s of training wall time "
          f"({total:.0f} s with both evaluations)")
    summary = {"config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()},
               "before": before, "after": after, "greedy_after": greedy, "train_wall_s": train_wall,
               "total_s": total, "history": [asdict(r) for r in trainer.history]}
    (cfg.out / "history.json").write_text(json.dumps(summary, indent=1))
    plot(trainer.history, before, after, cfg.out / "reward.png", cfg)
    return summary


async def compare(cfg: Config) -> dict:
    """The same number of steps in sync and then async mode, each from the original weights
    with a fresh optimizer, on one service; wall times side by side (no evaluation)."""
    from rollout_service.local import vllm_local

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
    ap = argparse.ArgumentParser(prog="python -m examples.grpo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="a running service (default: start `rollout up --engine vllm`)")
    ap.add_argument("--redis-url", help="with no --url: the Redis `rollout up` uses (default: embedded)")
    ap.add_argument("--out", type=Path, help="checkpoints, history, plot (default /tmp/grpo-TASK)")
    ap.add_argument("--task", choices=sorted(TASKS), default=d.task, help="what to learn (default calc)")
    ap.add_argument("--level", type=int, choices=[1, 2, 3], default=d.level, help="household: the game's level")
    ap.add_argument("--mode", choices=["sync", "async", "compare"], default=d.mode,
                    help="compare: --steps in sync, then in async mode; wall times side by side")
    for name in ("steps", "prompts", "group_size", "inflight", "max_staleness", "max_tokens", "max_turns",
                 "eval_tasks", "eval_every", "seed", "threads", "keep"):
        ap.add_argument("--" + name.replace("_", "-"), type=int,
                        default=None if name in TASK_DEFAULTS else getattr(d, name))
    for name in ("lr", "clip", "temperature", "format_bonus", "max_minutes", "target"):
        ap.add_argument("--" + name.replace("_", "-"), type=float,
                        default=None if name in TASK_DEFAULTS else getattr(d, name))
    ap.add_argument("--eval-greedy", action="store_true", help="also measure greedy held-out success at the end")
    a = ap.parse_args(argv)
    if a.target and not a.eval_every:
        ap.error("--target needs --eval-every N (the periodic held-out check it is compared with)")
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
