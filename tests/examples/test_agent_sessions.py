"""The agent-sessions example: an Agents SDK agent per session, n sessions per task grouped
for GRPO, read back as trajectories the trainer's `advantages` takes unchanged."""

from __future__ import annotations

import redis as syncredis

from examples.agent_sessions import guessing_policy, run
from rollout_service.engines.sim import SimEngine
from rollout_service.engines.sim_server import create_app as sim_app
from tests.conftest import REDIS_URL, LiveServer
from trainer_client.grpo import advantages
from wire import EngineInfo


async def test_sessions_form_grpo_groups_the_trainer_consumes(gateway, keys):
    with LiveServer(sim_app(SimEngine("sim", seed=1, policy=guessing_policy))) as engine:
        syncredis.Redis.from_url(REDIS_URL).hset(keys.engines, "sim", EngineInfo(id="sim", url=engine.url)
                                                 .model_dump_json())
        trajs = await run(gateway.url, "sim", [{"seed": 102}, {"seed": 100}], 4, None)
    groups = sorted({t.batch_id for t in trajs})
    assert len(groups) == 2 and all(sum(t.batch_id == g for t in trajs) == 4 for g in groups)
    assert sorted(t.sample_index for t in trajs if t.batch_id == groups[0]) == [0, 1, 2, 3]
    for t in trajs:
        assert t.usable and t.reward in (0.0, 1.0) and len(t.turns) == 2 and len(t.samples()) == 1
        call = t.messages[2].tool_calls[0]
        assert call.function.name == "calc" and t.messages[3].tool_call_id == call.id
        assert sum(t.loss_mask) == sum(len(turn.output_ids) for turn in t.turns)
    # seeded (session k samples with seed k): task 102's group mixes rewards, task 100's does not
    first = sorted((t for t in trajs if t.batch_id == groups[0]), key=lambda t: t.sample_index)
    assert [t.reward for t in first] == [1.0, 0.0, 0.0, 1.0]
    advs = dict(zip((t.id for t in trajs), advantages(trajs)))
    assert [round(advs[t.id], 3) for t in first] == [1.0, -1.0, -1.0, 1.0]
    assert all(advs[t.id] is None for t in trajs if t.batch_id == groups[1])
