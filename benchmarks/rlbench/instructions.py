"""What the agent reads: `task.json` (for scripts) and `INSTRUCTIONS.md` (for people and agents)."""

from __future__ import annotations

import json
from typing import Any

from benchmarks.rlbench.catalog import BenchTask, Level


def task_info(spec: BenchTask, cfg, n_train: int, service_url: str) -> dict[str, Any]:
    return {
        "task": spec.name, "level": spec.level.value, "env": spec.env, "goal": spec.goal,
        "budget_min": round(cfg.budget_s / 60, 3), "grader": cfg.url, "train_file": "data/train.jsonl",
        "n_train": n_train, "base_model": "base_model", "rollout_service": service_url,
        "evaluation": {"n_test": spec.n_test, "group_size": 1, "sampling": spec.sampling(),
                       "max_turns": spec.max_turns},
    }


_JUDGE_NOTE = """
**About the judge.** The grader's judge is fixed: the *base* model, served by the grader on an
engine of its own that submissions never touch (or a stronger engine the operator named).
In your own service (`rollout up`), the `judge` environment asks *your* policy engine:
the model you train judges itself there, and a reward it learns to inflate that way will not
carry over to the grader's fixed judge.
"""


def render(spec: BenchTask, cfg, info: dict[str, Any]) -> str:
    ev = info["evaluation"]
    judge = _JUDGE_NOTE if spec.level is Level.judge else ""
    return f"""# RL-Bench task `{spec.name}` ({spec.level.value})

Improve the model in `base_model/` on this task within **{info['budget_min']:g} minutes** of
wall-clock time, counted from the moment the grader started (`GET {cfg.url}/time`).

**The task** (environment `{spec.env}` of the rollout service): {spec.goal}

## What you have

- `base_model/`: the model to improve, a Hugging Face model folder. Do not change it; write
  your checkpoints to new folders (e.g. `checkpoints/step-10/`) with the same architecture and
  tokenizer, as `save_pretrained` writes them (`config.json` and `*.safetensors`).
- `data/train.jsonl`: {info['n_train']} training tasks, one JSON object per line, each ready
  to submit to the rollout service as a task of environment `{spec.env}`.
- `task.json`: everything on this page, for scripts.
- The hidden test set: {ev['n_test']} tasks you never see; no train task shares its content.
  Training on tasks other than those in `data/train.jsonl` breaks the rules.

## Getting rollouts

Start your own rollout service (the grader has a separate one, so grading never changes the
weights you train with), then ask it for trajectories of the train tasks:

```bash
rollout up --engine vllm --port 8000        # or point to any vLLM: rollout up --help
```

```python
import json
from trainer_client import RolloutClient

tasks = [json.loads(line) for line in open("data/train.jsonl")][:8]
with RolloutClient("{info['rollout_service']}") as c:
    batch = c.submit(tasks, env="{spec.env}", group_size=4, max_turns={ev['max_turns']},
                     sampling={{"temperature": 1.0, "max_tokens": {spec.max_tokens}}})
    for traj in c.iter_results(batch.id):
        print(traj.reward, traj.usable, traj.failure)   # traj.token_ids, traj.logprobs, traj.loss_mask
    c.update_weights(path="{cfg.workspace}/checkpoints/step-1")  # after a training step (a path the engines can read)
```

Trajectories carry the exact token ids, logprobs, a loss mask and the policy version of every
turn; `traj.usable` is False for infrastructure failures (mask them, they are not reward 0).
`trainer_client/grpo.py` has GRPO helpers, `examples/grpo_calc.py` a whole training loop.
{judge}
## Submitting

The grader listens on {cfg.url}. Submit a model folder (a relative path is taken from this
workspace); it is loaded into the grader's engine and rolled out once on every hidden test
task with `group_size=1`, `max_turns={ev['max_turns']}` and sampling `{json.dumps(ev['sampling'])}`
(greedy). The score is the mean reward.

```bash
curl -s -X POST {cfg.url}/submit -H 'content-type: application/json' -d '{{"model": "checkpoints/step-10"}}'
curl -s {cfg.url}/time        # budget_s, elapsed_s, remaining_s
curl -s {cfg.url}/health
```

The answer: `score`, `baseline` (the base model's score), `improvement` (score - baseline),
`best` (the best score so far, the baseline included), `submission` (its number), the
trajectories' failure kinds and the evaluation's seconds. Submissions are evaluated one at a
time, in order. Errors are `{{"error": {{"code", "message", "details"}}}}`: 404 `model_not_found`,
422 `not_a_model` or `invalid_request`, 403 `budget_spent` once the budget is over, 503
`evaluation_failed` when the grader's own service broke (that submission is not scored).
Every submission is recorded; what counts is your best score within the budget.
"""
