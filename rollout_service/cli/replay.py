"""`rollout replay FILE`: re-run a recording's environments (no gateway, Redis or engine), or
re-score it (`--score`), or re-sample its turns on an engine (`--engine-url`). Exit status 1
when any trajectory's environment replay differs."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from rich.table import Table

from rollout_service.cli._console import console


def cmd_replay(args) -> None:
    from rollout_service.recording import RecordingError, read

    try:
        header, records = read(Path(args.file))
    except RecordingError as e:
        raise SystemExit(f"error: {e}") from None
    console.print(f"recording of batch [bold]{header.batch.id}[/] ({header.request.env}, {len(records)} trajectories)")
    if args.score:
        _rescore(args, records)
    elif args.engine_url:
        _resample(args, header, records)
    else:
        _replay(args, records)


def _replay(args, records) -> None:
    from env_workers.envs import judge
    from env_workers.resources import Pools
    from env_workers.sandbox import backends
    from rollout_service.config import Settings
    from rollout_service.replay import REPLAY_POOL, replay

    s = Settings.from_env()
    backends.configure(s.sandbox_backend, docker_url=s.sandbox_docker_url, image=s.sandbox_image)
    if args.judge_url:
        judge.configure(judge.OpenAIJudge(args.judge_url, args.judge_model))
    pools = Pools(REPLAY_POOL)
    try:
        verdicts = [replay(r, pools) for r in records]
    finally:
        pools.close()
    table = Table("trajectory", "env", "replay", "first differing turn", "detail")
    for v in verdicts:
        colour = {"match": "green", "mismatch": "red"}.get(v.outcome, "yellow")
        turn = "" if v.outcome != "mismatch" else ("opening" if v.turn is None else str(v.turn))
        table.add_row(v.trajectory_id, v.env, f"[{colour}]{v.outcome}[/]", turn, v.detail)
    console.print(table)
    counts = {o: sum(v.outcome == o for v in verdicts) for o in ("match", "mismatch", "skipped")}
    console.print(", ".join(f"{n} {o}" for o, n in counts.items()))
    if args.json:
        Path(args.json).write_text(json.dumps(
            [{"trajectory_id": v.trajectory_id, "env": v.env, "outcome": v.outcome, "turn": v.turn,
              "detail": v.detail} for v in verdicts], indent=1))
    if counts["mismatch"]:
        sys.exit(1)


def _rescore(args, records) -> None:
    from rollout_service.replay import load_scorer, rescore, sign_flips

    try:
        fn = load_scorer(args.score)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    rows = rescore(records, fn)
    table = Table("trajectory", "group", "recorded reward", "new reward")
    for r in rows:
        table.add_row(r.trajectory_id, str(r.group_index), "-" if r.recorded is None else f"{r.recorded:.4g}",
                      f"{r.new:.4g}")
    console.print(table)
    if rows:
        old = statistics.fmean(r.recorded or 0.0 for r in rows)
        new = statistics.fmean(r.new for r in rows)
        changed = sum((r.recorded or 0.0) != r.new for r in rows)
        console.print(f"{len(rows)} usable trajectories: mean reward {old:.4g} recorded, {new:.4g} with "
                      f"{args.score}; {changed} changed; {sign_flips(rows)} GRPO advantage signs changed")
    if len(rows) < len(records):  # (the table alone said nothing of them: an empty one, for a failed batch)
        console.print(f"{len(records) - len(rows)} of {len(records)} not re-scored: failed or cancelled, "
                      "they carry no reward to compare (`usable` is false)")
    if args.json:
        Path(args.json).write_text(json.dumps(
            [{"trajectory_id": r.trajectory_id, "group_index": r.group_index, "recorded": r.recorded,
              "new": r.new} for r in rows], indent=1))


def _resample(args, header, records) -> None:
    import asyncio

    from rollout_service.engines.vllm import VLLMEngine
    from rollout_service.resample import resample

    async def run():
        engine = VLLMEngine("replay", args.engine_url, args.model)
        try:
            return await resample(records, header.request, engine, concurrency=args.concurrency)
        finally:
            await engine.aclose()

    verdicts = asyncio.run(run())
    table = Table("trajectory", "turn", "first differing token", "sampled ids (recorded / now)")
    for v in verdicts:
        if v.diverged:
            table.add_row(v.trajectory_id, str(v.turn), str(v.first_token), f"{v.recorded} / {v.replayed}")
    diverged = sum(v.diverged for v in verdicts)
    if diverged:
        console.print(table)
    lp = max((v.max_logprob_diff for v in verdicts), default=0.0)
    console.print(f"{len(verdicts)} turns re-sampled on {args.engine_url}: {len(verdicts) - diverged} reproduced, "
                  f"{diverged} diverged (divergence rate {diverged / max(len(verdicts), 1):.3f}); largest logprob "
                  f"difference over identical ids {lp:.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps(
            [{"trajectory_id": v.trajectory_id, "turn": v.turn, "diverged": v.diverged, "first_token": v.first_token,
              "recorded": v.recorded, "replayed": v.replayed, "max_logprob_diff": v.max_logprob_diff}
             for v in verdicts], indent=1))
