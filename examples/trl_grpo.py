"""TRL's GRPOTrainer training SmolLM2-135M-Instruct on CPU, its rollouts from the service.

    python -m examples.trl_grpo --steps 3              # starts `rollout up --engine vllm`
    python -m examples.trl_grpo --url http://127.0.0.1:8000 --steps 3

Each step: TRL hands `ServiceRollout` its prompts (calc word problems by seed, each repeated
`num_generations` times), the service runs the multi-turn `calc` episodes on vLLM, and TRL
trains on the exact ids and logprobs with the env's reward; the new weights are saved and
pushed to vLLM (`update_weights`) before the next step's rollouts. Prints one line per step.
A few steps show the plumbing, not learning: measured here (2 shared cores), `--steps 2`
took ~4 min a step and the env reward stayed 0.000 (no group had any variance; the learning
runs in `python -m examples.grpo` add a format bonus for that reason, see the README).
Needs `pip install -e ".[trl]"` and `rollout engine prepare smollm2`.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from types import SimpleNamespace


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="a running gateway (default: start `rollout up --engine vllm`)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--generations", type=int, default=4, help="num_generations: the GRPO group size")
    p.add_argument("--out", type=Path, default=Path("/tmp/trl-grpo"))
    args = p.parse_args()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL

    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from examples.grpo.__main__ import service
    from examples.grpo.tasks import TASKS
    from rollout_service.local import vllm_local
    from trainer_client.trl import ServiceRollout, env_reward

    args.out.mkdir(parents=True, exist_ok=True)
    calc = TASKS["calc"]  # one worked example before each question: SmolLM2's base success is not zero
    path = vllm_local.model_dir("smollm2")
    model, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)

    class Report(TrainerCallback):
        def on_log(self, _args, state, _control, logs=None, **_):
            if logs and "rewards/env_reward/mean" in logs:
                print(f"step {state.global_step}: env reward {logs['rewards/env_reward/mean']:.3f}, "
                      f"completion length {logs.get('completions/mean_length', 0):.1f}", flush=True)

    with service(SimpleNamespace(url=args.url, redis_url=None, out=args.out)) as url:
        rollout = ServiceRollout(url, env=calc.env, task=lambda seed: calc.make(int(seed), 1),
                                 weights_dir=args.out / "pushed", max_turns=calc.max_turns)
        config = GRPOConfig(output_dir=str(args.out / "trainer"), max_steps=args.steps, num_generations=args.generations,
                            per_device_train_batch_size=2 * args.generations, max_completion_length=calc.max_tokens,
                            learning_rate=calc.lr, temperature=1.0, logging_steps=1, report_to=[], save_strategy="no",
                            use_cpu=True, bf16=False, seed=0)
        trainer = GRPOTrainer(model=model, processing_class=tok, args=config, reward_funcs=[env_reward],
                              train_dataset=Dataset.from_dict({"prompt": [str(s) for s in range(1000, 1400)]}),
                              rollout_func=rollout, callbacks=[Report()])
        try:
            trainer.train()
        finally:
            rollout.close()


if __name__ == "__main__":
    main()
