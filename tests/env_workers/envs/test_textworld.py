"""`textworld`: a scripted expert wins every generated game; mistakes are text, not errors."""

from __future__ import annotations

from collections import deque

import pytest

from env_workers.envs.textworld import TextWorldEnv, World, generate


def path(w: World, start: str, goal: str) -> list[str]:
    prev, todo = {start: None}, deque([start])
    while todo:
        r = todo.popleft()
        for n in w.exits[r]:
            if n not in prev:
                prev[n] = r
                todo.append(n)
    out = []
    while goal != start:
        out.append(goal)
        goal = prev[goal]
    return out[::-1]


def expert(w: World) -> list[str]:
    obj, target, clean = w.goal
    src = next(r for r, objs in w.contents.items() if obj in objs)
    here, plan = w.here, []
    for stop, acts in [(w.where[src], ([f"open {src}"] if src in w.closed else []) + [f"take {obj}"]),
                       *([("kitchen", [f"clean {obj} with sink"])] if clean else []),
                       (w.where[target], ([f"open {target}"] if target in w.closed else []) + [f"put {obj} in {target}"])]:
        plan += [f"go {r}" for r in path(w, here, stop)] + acts
        here = stop
    return plan


@pytest.mark.parametrize("seed", range(20))
def test_expert_wins_with_sparse_reward(seed):
    env = TextWorldEnv()
    env.reset({"seed": seed})
    plan = expert(generate(seed))
    rewards = [env.step(a) for a in plan]
    assert [r.reward for r in rewards] == [0.0] * (len(plan) - 1) + [1.0]
    assert rewards[-1].terminated and rewards[-1].info["won"]


def test_clean_goal_needs_cleaning():
    seed = next(s for s in range(200) if generate(s).goal[2])
    w, env = generate(seed), TextWorldEnv()
    env.reset({"seed": seed})
    plan = [a for a in expert(w) if not a.startswith("clean")]
    assert all(env.step(a).reward == 0.0 for a in plan)


def test_impossible_commands_are_explained():
    env = TextWorldEnv()
    obs, _ = env.reset({"seed": 3})
    assert "Your task is to" in obs[1].content
    assert "can't go" in env.step("go moon").observation[0].content
    assert "not carrying" in env.step("put spoon in sofa").observation[0].content
    assert "Unknown command" in env.step("dance").observation[0].content


def test_runs_out_of_steps():
    env = TextWorldEnv(max_steps=3)
    env.reset({"seed": 1})
    assert [env.step("look").truncated for _ in range(3)] == [False, False, True]
