"""An off-the-shelf agent (the OpenAI Agents SDK) solving `calc` tasks through the session
proxy, `n` sessions per task forming a GRPO group, the groups' trajectories read back as the
trainer consumes them.

    python -m examples.agent_sessions                      # in-process gateway + simulated engine
    python -m examples.agent_sessions --tasks 4 --n 8
    python -m examples.agent_sessions --url http://127.0.0.1:8000 --model smollm2   # a running service

(run from the repository root; the in-process mode needs Redis at 127.0.0.1:6379 and uses a
key prefix of its own). The agent is a plain `agents.Agent` with a `calc` function tool; its
OpenAI client points at a session (`base_url = gateway + /v1/sessions/{id}`), created with
`group` = the task, so the trainer's `advantages` groups the n sessions of a task. Each
session ends with `finish(reward)`, reward 1 for the right answer.

The in-process engine is the simulated one with a policy that writes a Hermes tool call for
a guessed expression (two of the problem's numbers, a random operator) and then answers with
the tool's result: right or wrong depending on the guess, so rewards vary within a group.
Prints one line per group (rewards, advantages, training samples) and writes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import uuid

import httpx
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

from env_workers.envs.calc import evaluate
from env_workers.envs.problems import parse_answer, task_problem
from trainer_client.grpo import advantages
from wire import Trajectory

set_tracing_disabled(True)  # the SDK would export traces to OpenAI otherwise


@function_tool
def calc(expression: str) -> str:
    """Evaluate integer arithmetic (+ - * // %), e.g. '12 * 7'."""
    try:
        return str(evaluate(expression))
    except (ValueError, SyntaxError, ZeroDivisionError) as e:
        return f"error: {e}"


def guessing_policy(prompt: str, rng: random.Random) -> str:
    """The simulated model: call `calc` on a guess, then answer with what it returned."""
    turns = prompt.split("<|im_start|>")
    last = turns[-2] if len(turns) > 1 else prompt
    if last.startswith("tool\n"):
        return f"answer: {last[5:].split('<|im_end|>')[0].strip()}"
    user = [t for t in turns if t.startswith("user\n")][-1]
    nums = [int(n) for n in re.findall(r"\d+", user)][:2] or [1, 1]
    a, b = (nums + nums)[:2]
    expr = f"{a} {rng.choice('+-*')} {b}"
    return f'<tool_call>\n{json.dumps({"name": "calc", "arguments": {"expression": expr}})}\n</tool_call>'


async def episode(url: str, model: str, task: dict, group: str, k: int, api_key: str | None) -> Trajectory:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600) as http:
        s = (await http.post("/v1/sessions", json={"group": group, "sample_index": k,
                                                   "metadata": {"task": json.dumps(task)}})).json()
        client = AsyncOpenAI(base_url=url + s["base_url_path"], api_key=api_key or "unused", max_retries=0)
        agent = Agent(name="calculator", tools=[calc],
                      instructions="Solve the problem. Use the calc tool, then write 'answer: <number>'.",
                      model=OpenAIChatCompletionsModel(model=model, openai_client=client),
                      model_settings=ModelSettings(extra_args={"seed": k}))  # reproducible: sample k, seed k
        question, expected = task_problem(task)
        try:
            result = await Runner.run(agent, question, max_turns=4)
            reward = float(parse_answer(str(result.final_output)) == expected)
        except Exception as e:  # the agent gave up (turn limit, a model error): an episode with reward 0
            print(f"  {group}/{k}: {type(e).__name__}: {e}")
            reward = 0.0
        r = await http.post(f"/v1/sessions/{s['id']}/finish", json={"reward": reward})
        return Trajectory.model_validate(r.json())


async def run(url: str, model: str, tasks: list[dict], n: int, api_key: str | None) -> list[Trajectory]:
    run_id = uuid.uuid4().hex[:6]
    groups = await asyncio.gather(*(episode(url, model, task, f"calc-{run_id}-{i}", k, api_key)
                                    for i, task in enumerate(tasks) for k in range(n)))
    trajs = list(groups)
    advs = advantages(trajs)  # the trainer's own function, on the sessions' trajectories unchanged
    for i in range(len(tasks)):
        members = [(t, a) for t, a in zip(trajs, advs) if t.batch_id == f"calc-{run_id}-{i}"]
        rewards = [t.reward for t, _ in members]
        adv = ["-" if a is None else f"{a:+.2f}" for _, a in members]
        turns = [len(t.turns) for t, _ in members]
        print(f"task {i}: rewards {rewards} advantages {adv} turns {turns} "
              f"sampled tokens {sum(sum(t.loss_mask) for t, _ in members)}")
    return trajs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", help="a running gateway; default: start one in-process with a simulated engine")
    ap.add_argument("--model", default="sim")
    ap.add_argument("--api-key")
    ap.add_argument("--tasks", type=int, default=3)
    ap.add_argument("--n", type=int, default=4, help="sessions per task (the GRPO group size)")
    args = ap.parse_args()
    tasks = [{"seed": 100 + i} for i in range(args.tasks)]
    if args.url:
        asyncio.run(run(args.url, args.model, tasks, args.n, args.api_key))
        return
    from rollout_service.app import create_app
    from rollout_service.config import Settings
    from rollout_service.engines.sim import SimEngine
    from rollout_service.engines.sim_server import create_app as sim_app
    from tests.conftest import LiveServer, REDIS_URL

    import redis

    prefix = f"rsexample:{uuid.uuid4().hex[:8]}:"
    try:
        with LiveServer(sim_app(SimEngine("sim", seed=1, policy=guessing_policy))) as engine, \
                LiveServer(create_app(Settings(redis_url=REDIS_URL, key_prefix=prefix))) as gateway:
            httpx.post(f"{gateway.url}/v1/engines", json={"id": "sim", "url": engine.url}).raise_for_status()
            asyncio.run(run(gateway.url, args.model, tasks, args.n, None))
    finally:
        r = redis.Redis.from_url(REDIS_URL)
        for key in r.scan_iter(match=f"{prefix}*", count=1000):
            r.delete(key)


if __name__ == "__main__":
    main()
