"""Engine loads as workers report them: a dead worker's entry stops counting."""

from __future__ import annotations

import time

from scheduler.registry import Registry


async def test_a_dead_workers_load_stops_counting_while_others_keep_the_key_alive(redis, keys):
    reg = Registry(redis, keys)
    await reg.report("w-live", {"e0": 100}, set())
    await reg.report("w-dead", {"e0": 2_328}, set())
    assert (await reg.engine_loads(["e0"]))["e0"] == (2_428, True)
    # w-dead stops reporting; w-live keeps the hash (and its TTL) alive
    await redis.hset(keys.engine_load("e0"), "w-dead", f"2328@{int(time.time()) - 60}")
    await reg.report("w-live", {"e0": 0}, set())
    assert (await reg.engine_loads(["e0"]))["e0"] == (0, True)  # an idle engine reads idle (a drain can finish)
