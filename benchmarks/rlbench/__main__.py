"""`python -m benchmarks.rlbench`: set up a task, serve its grader, summarize the records.

    python -m benchmarks.rlbench tasks
    python -m benchmarks.rlbench setup --task math --workspace /tmp/ws --budget-min 60
    python -m benchmarks.rlbench serve /tmp/ws.grader --engine vllm
    python -m benchmarks.rlbench summary /tmp/ws.grader --json benchmarks/results/rlbench.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path


def cmd_tasks(args) -> None:
    from benchmarks.rlbench.catalog import TASKS

    for t in TASKS.values():
        print(f"{t.name:<10} {t.level.value:<24} env {t.env:<10} test {t.n_test:>3}  max_turns {t.max_turns:>2}  "
              f"{t.goal.split('. ')[0]}.")


def cmd_setup(args) -> None:
    from benchmarks.rlbench.workspace import setup

    model = args.base_model
    if model is None:
        from rollout_service.local import vllm_local

        model = vllm_local.prepare_model("smollm2")  # cached after the first time
    try:
        state = setup(args.task, args.workspace, model, args.budget_min, args.state, args.port, args.service_url)
    except ValueError as e:
        raise SystemExit(f"setup: {e}") from None
    cfg = state.config
    print(f"workspace  {cfg.workspace}   (read {cfg.workspace}/INSTRUCTIONS.md)")
    print(f"state      {state.dir}   (hidden test tasks and records; keep it away from the agent)")
    print(f"run        {cfg.run}   grader {cfg.url} once served:")
    print(f"           python -m benchmarks.rlbench serve {state.dir}")


def cmd_serve(args) -> None:
    from rich.console import Console

    from benchmarks.rlbench import server
    from benchmarks.rlbench.catalog import Level
    from benchmarks.rlbench.evaluate import EvaluationFailed, ServiceEvaluator
    from benchmarks.rlbench.grader import Grader
    from benchmarks.rlbench.stack import GradingStack, StackConfig
    from benchmarks.rlbench.workspace import State
    from rollout_service.up import port_in_use

    def _terminate(*_):  # SIGTERM stops the grading service too, like Ctrl-C
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    console = Console()
    state = State.load(args.state)
    cfg, spec = state.config, state.task
    if port_in_use("127.0.0.1", cfg.port):
        raise SystemExit(f"port {cfg.port} (the grader's, named in INSTRUCTIONS.md) is taken")
    if args.service_url:
        engine = f"external:{args.service_url}"
        stack = contextlib.nullcontext(args.service_url)
        console.print(f"[yellow]![/] grading through {args.service_url}: its engines get every submission's weights"
                      + ("; its judge is whatever its env workers ask" if spec.level is Level.judge else ""))
    else:
        engine = args.engine
        stack = GradingStack(StackConfig(
            engine=args.engine, base_model=Path(cfg.base_model),
            logs=state.logs, prefix=args.key_prefix or f"rlbench:{cfg.run}:", judge=spec.level is Level.judge,
            redis_url=args.redis_url, judge_url=args.judge_url, judge_model=args.judge_model,
            judge_tokenizer=args.judge_tokenizer), say=console.print)
    try:
        with stack as url:
            evaluator = ServiceEvaluator(url, spec, state.test_tasks(), timeout_s=args.eval_timeout_min * 60,
                                         tag=cfg.run)
            grader = Grader(state, evaluator, engine=engine)
            with console.status("scoring the base model on the hidden test tasks…"):
                try:
                    run = asyncio.run(grader.start())
                except EvaluationFailed as e:
                    raise SystemExit(f"the base model could not be scored: {e} (failures {e.failures}); "
                                     f"logs: {state.logs}") from None
            left = grader.time().remaining_s
            console.print(f"run {run.run}  task {run.task} ({run.level})  baseline {run.baseline:.4f}  "
                          f"budget left {left / 60:.1f} min", soft_wrap=True)
            server.serve(grader, cfg.port, ready=lambda: print(f"grader {cfg.url}", flush=True))
    except KeyboardInterrupt:
        console.print("stopping…")


def cmd_sim_judge(args) -> None:
    from benchmarks.rlbench.stack import serve_sim_judge

    serve_sim_judge(args.port)


def cmd_summary(args) -> None:
    from benchmarks.rlbench import summary

    summary.main(args.states, args.json, args.margin)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.rlbench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    sp = sub.add_parser("tasks", help="list the six tasks and their levels")
    sp.set_defaults(fn=cmd_tasks)

    sp = sub.add_parser("setup", help="create a workspace for the agent and the grader's state folder")
    sp.add_argument("--task", required=True, help="math, code, instruct, household, shop or search_qa")
    sp.add_argument("--workspace", required=True, help="a new (or empty) folder for the agent")
    sp.add_argument("--state", help="the grader's folder, outside the workspace (default: WORKSPACE.grader)")
    sp.add_argument("--budget-min", type=float, default=60.0, help="the agent's time budget (default 60)")
    sp.add_argument("--base-model", help="model folder (default: SmolLM2-135M-Instruct, `rollout engine prepare`)")
    sp.add_argument("--port", type=int, help="the grader's port (default: a free one, chosen now)")
    sp.add_argument("--service-url", default="http://127.0.0.1:8000",
                    help="the agent's own rollout service, named in INSTRUCTIONS.md (default http://127.0.0.1:8000)")
    sp.set_defaults(fn=cmd_setup)

    sp = sub.add_parser("serve", help="start the grading service and the grader; prints the grader's URL")
    sp.add_argument("state", help="the state folder `setup` made")
    sp.add_argument("--engine", choices=["vllm", "sim"], default="vllm",
                    help="vllm: the base model on vLLM (CPU); sim: the simulated engine (default vllm)")
    sp.add_argument("--redis-url", help="Redis for the grading service (default: an embedded one in STATE/redis)")
    sp.add_argument("--key-prefix", help="its Redis key prefix (default rlbench:RUN:)")
    sp.add_argument("--service-url", help="grade through this running rollout service instead of a private one")
    sp.add_argument("--eval-timeout-min", type=float, default=60.0,
                    help="longest one evaluation may take, then it fails with 503 (default 60)")
    sp.add_argument("--judge-url", help="judge tasks: a fixed engine (vLLM API) to judge with (default: base model)")
    sp.add_argument("--judge-model", default="judge", help="--judge-url's served model name")
    sp.add_argument("--judge-tokenizer", default="byte", help="--judge-url's tokenizer folder")
    sp.set_defaults(fn=cmd_serve)

    sp = sub.add_parser("summary", help="per-run summary of recorded runs; one line per figure")
    sp.add_argument("states", nargs="+", help="grader state folders")
    sp.add_argument("--json", help="also write the summaries to this JSON file")
    sp.add_argument("--margin", type=float, default=0.0,
                    help="an improvement is a score above baseline + margin (default 0; see README: noise)")
    sp.set_defaults(fn=cmd_summary)

    # Parts of the grading service (started by `serve`).
    sp = sub.add_parser("sim-judge", help="(internal, started by serve) the simulated judge engine")
    sp.add_argument("--port", type=int, required=True)
    sp.set_defaults(fn=cmd_sim_judge)

    args = p.parse_args(argv)
    args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
