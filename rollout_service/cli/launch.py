"""`rollout launch-plan`: which engines to launch for the next rollout phase (`scheduler.launch`).

Reads the deployment's Redis as `rollout allocator` does ($ROLLOUT_REDIS_URL, $ROLLOUT_KEY_PREFIX):
the demand the allocator recorded at each decision of the recent phase, and the step model it
measured on engines of each size (the `gpus` an engine was registered with). Ranks every launch of
`--gpus` GPUs from the measured sizes — colocated, split, and split with prefill and decode engines
of different sizes — and prints the best ones beside the launch running now. It plans; starting
the engines is the deployment's (vLLM fixes an engine's tensor parallelism when it starts).
"""

from __future__ import annotations

import asyncio
import json
import time

from rich.table import Table

from rollout_service.cli._console import console
from rollout_service.config import Settings


def current_launch(engines: list, model: str):
    """The launch the registered engines of `model` make, where it is one (`None`: sizes that no
    `Launch` describes, such as mixed engines of two sizes)."""
    from scheduler.launch import Launch

    mine = [e for e in engines if e.model == model]
    pre = {e.gpus for e in mine if e.role == "prefill"}
    rest = {e.gpus for e in mine if e.role != "prefill"}
    if not mine or len(pre) > 1 or len(rest) != 1:
        return None
    size = rest.pop()
    count = {r: sum(e.role == r for e in mine) for r in ("prefill", "decode", "mixed")}
    prefill_size = pre.pop() if pre else 0
    return Launch(size, count["decode"], count["mixed"], count["prefill"], 0 if prefill_size == size else prefill_size)


def cmd_launch_plan(args) -> None:
    from scheduler.allocator import AllocatorConfig
    from scheduler.connection import connect
    from scheduler.keys import Keys
    from scheduler.launch import candidates, plan, score
    from scheduler.registry import Registry

    s = Settings.from_env()

    async def read():
        r = connect(s.redis_url)
        try:
            reg = Registry(r, Keys(s.key_prefix))
            engines = await reg.engines()
            models = sorted({e.model for e in engines})
            model = args.model or (models[0] if len(models) == 1 else None)
            if model is None:
                raise SystemExit("--model: the registered engines serve " + (", ".join(models) or "no model"))
            since = time.time() - args.minutes * 60 if args.minutes else 0.0
            return engines, model, await reg.profiles(model), await reg.phase(since)
        finally:
            await r.aclose()

    engines, model, profiles, demands = asyncio.run(read())
    if not profiles:
        raise SystemExit(f"no engine size measured for {model!r} yet: run a rollout phase under `rollout allocator` "
                         "on engines of each size to compare (registered with --gpus)")
    if not demands:
        raise SystemExit("no demand recorded" + (f" in the last {args.minutes:g} minutes" if args.minutes else "") +
                         ": run a rollout phase under `rollout allocator` first")
    now = current_launch(engines, model)
    gpus = args.gpus or (now.gpus if now else 0)
    if gpus < 1:
        raise SystemExit("--gpus: how many GPUs the next launch has (the engines registered now make no launch)")
    cands = candidates(gpus, profiles, args.most)
    if not cands:
        raise SystemExit(f"no launch of {gpus} GPUs from the measured engine sizes {sorted(profiles)}")
    config = AllocatorConfig(response_kv_pushed=bool(engines) and all(e.kv_read_back for e in engines))
    ranked = plan(cands, demands, profiles, config)
    now_s = None
    if now is not None and now.gpus == gpus and {now.size, now.prefill_gpus} <= set(profiles):
        now_s = score(now, demands, profiles, config)
    if args.json:
        print(json.dumps({"model": model, "gpus": gpus, "decisions": len(demands),
                          "sizes": {t: c.samples for t, c in sorted(profiles.items())},
                          "current": {"launch": now.describe(), "seconds": now_s} if now_s is not None else None,
                          "ranked": [{"launch": c.describe(), "seconds": sec, "size": c.size, "decode": c.decode,
                                      "mixed": c.mixed, "prefill": c.prefill, "prefill_size": c.prefill_gpus}
                                     for c, sec in ranked[: args.top]]}, indent=1))
        return
    console.print(f"{model} on {gpus} GPUs: {len(demands)} decisions of demand; engine sizes measured: "
                  + ", ".join(f"{t} GPU ({c.samples} samples)" for t, c in sorted(profiles.items())))
    table = Table("rank", "launch", "estimated s", "speed vs now")
    for i, (c, sec) in enumerate(ranked[: args.top], 1):
        vs = f"{now_s / sec:.2f}x" if now_s and sec > 0 else "-"
        table.add_row(str(i), c.describe() + ("  (now)" if c == now else ""), f"{sec:.1f}", vs)
    console.print(table)
    if now is not None and now_s is None:
        console.print(f"now: {now.describe()} (not scored: its sizes were not all measured, or other GPU count)")
    console.print("[dim]Estimated by the allocator's model; simulated, its first pick was within 2% of the best launch "
                  "in 74% of cells, 0.87x at worst (benchmarks/sim/README.md, 'Choosing the launch').[/]")
