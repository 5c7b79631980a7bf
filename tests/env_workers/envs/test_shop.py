"""`shop`: searching and clicking reach a full-reward purchase; partial matches score partially."""

from __future__ import annotations

import re

import pytest

from env_workers.envs.shop import ShopEnv, catalog, instruction, score


def fits(goal, p) -> bool:
    return (p.category == goal["category"] and set(goal["attributes"]) <= p.attributes and p.price <= goal["price"]
            and all(v in p.options.get(k, []) for k, v in goal["options"].items()))


@pytest.mark.parametrize("seed", range(8))
def test_expert_buys_a_matching_product_for_full_reward(seed):
    goal, (products, _) = instruction(seed), catalog()
    env = ShopEnv(max_steps=30)
    env.reset({"seed": seed})
    r = env.step(f"search[{' '.join(goal['attributes'])} {goal['category']}]")
    while True:
        ids = re.findall(r"\[(B\d{5})\]", r.observation[0].content)
        pick = next((i for i in ids if fits(goal, products[i])), None)
        if pick:
            break
        assert "[next >]" in r.observation[0].content, "the target was never listed"
        r = env.step("click[next >]")
    r = env.step(f"click[{pick}]")
    assert "[buy now]" in r.observation[0].content
    for v in goal["options"].values():
        env.step(f"click[{v}]")
    done = env.step("click[buy now]")
    assert done.terminated and done.reward == 1.0 and done.info["bought"] == pick


def test_reward_is_dense():
    goal, (products, _) = instruction(0), catalog()
    p = next(p for p in products.values() if fits(goal, p))
    full = score(goal, p, dict(goal["options"]))
    no_options = score(goal, p, {})
    other = next(q for q in products.values() if q.category != goal["category"])
    assert full == 1.0 and 0.0 < no_options < 1.0 and score(goal, other, dict(goal["options"])) == 0.0


def test_wrong_buttons_are_text_and_steps_are_bounded():
    env = ShopEnv(max_steps=3)
    env.reset({"seed": 2})
    assert "no button" in env.step("click[buy now]").observation[0].content  # not on an item page
    assert "Invalid action" in env.step("buy it").observation[0].content
    assert env.step("search[mug]").truncated
