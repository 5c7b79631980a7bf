"""Measure the base model on several tasks before choosing one to train: for each task, its
success rate and well-formed rate over N probe seeds (never training or held-out seeds),
sampled as training samples them (T=1), through one `rollout up --engine vllm`.

    python -m examples.grpo.probe                        # every reasoning-gym task in tasks.RG_TASKS
    python -m examples.grpo.probe rg-gcd calc --tasks 64 --group-size 2

A task worth training has a success rate near zero but not at zero over the group (GRPO
learns from reward differences within a group) and a well-formed rate the format bonus can lift.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import warnings
from pathlib import Path

from examples.grpo.__main__ import service
from examples.grpo.tasks import HELD_OUT_BASE, TASKS
from examples.grpo.trainer import Config, rollouts
from trainer_client import AsyncRolloutClient

PROBE_BASE = HELD_OUT_BASE // 2  # between the training seeds (< 10**8) and the held-out ones (>= 10**9)


async def probe(names: list[str], n: int, group_size: int, out: Path) -> list[dict]:
    rows = []
    with service(Config(task=names[0], out=out)) as url:
        async with AsyncRolloutClient(url, timeout=120.0) as client:
            for name in names:
                cfg = Config(task=name, out=out)
                trajs = await rollouts(client, [cfg.spec.make(PROBE_BASE + i, cfg.level) for i in range(n)], cfg,
                                       group_size)
                usable = [t for t in trajs if t.usable]
                groups: dict[int, list[float]] = {}
                for t in usable:
                    groups.setdefault(t.group_index, []).append(t.reward)
                row = {"task": name, "trajectories": len(trajs), "usable": len(usable),
                       "success": sum(t.reward == 1.0 for t in usable) / max(len(usable), 1),
                       "well_formed": sum(float(cfg.spec.well_formed(t)) for t in usable) / max(len(usable), 1),
                       "groups_with_variance": sum(len(set(r)) > 1 for r in groups.values()) / max(len(groups), 1)}
                rows.append(row)
                print(f"probe {name:28} success {row['success']:.3f}  well-formed {row['well_formed']:.3f}  "
                      f"groups with reward variance {row['groups_with_variance']:.2f}  "
                      f"({row['usable']}/{row['trajectories']} usable)", flush=True)
    (out / "probe.json").write_text(json.dumps(rows, indent=1))
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m examples.grpo.probe", description=__doc__.split("\n\n")[0])
    ap.add_argument("tasks", nargs="*", help="names in examples/grpo/tasks.py (default: every rg-* task)")
    ap.add_argument("--tasks", dest="n", type=int, default=32, help="probe seeds per task (default 32)")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--out", type=Path, default=Path("/tmp/grpo-probe"))
    a = ap.parse_args(argv)
    names = a.tasks or sorted(k for k in TASKS if k.startswith("rg-"))
    unknown = [k for k in names if k not in TASKS]
    if unknown:
        ap.error(f"unknown task(s) {unknown}; one of {sorted(TASKS)}")
    a.out.mkdir(parents=True, exist_ok=True)
    asyncio.run(probe(names, a.n, a.group_size, a.out))


if __name__ == "__main__":
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
