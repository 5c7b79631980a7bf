"""`rollout up` on a machine where `rollout engine prepare` ran: the first batch is
answered by a real model (SmolLM2 on vLLM, CPU), not the simulated engine."""

from __future__ import annotations

import pytest

from tests.e2e.test_up import start_up, stop_up
from trainer_client import RolloutClient

pytestmark = pytest.mark.integration


def test_up_defaults_to_vllm_when_prepared(tmp_path):
    from rollout_service import up
    from rollout_service.local import vllm_local

    cache = vllm_local.cache_dir()  # the prepared venv and model, not a fresh tmp cache
    proc, url = start_up(tmp_path, {"ROLLOUT_CACHE_DIR": str(cache)})
    try:
        with RolloutClient(url) as c:
            engines = c.engines()
            assert engines[0]["model"] == "smollm2" and engines[0]["tokenizer"] == str(vllm_local.model_dir())
            batch = c.submit([{"seed": 1}], env="math", group_size=2, sampling={"temperature": 1.0,
                                                                               "max_tokens": 32})
            trajs = list(c.iter_results(batch.id))
        assert len(trajs) == 2 and all(t.failure is None for t in trajs)
        # SmolLM2's vocabulary, not the byte tokenizer's 259 ids
        assert max(max(t.token_ids) for t in trajs) > 259
        logs = up.log_dir(int(url.rsplit(":", 1)[1]))  # under ROLLOUT_CACHE_DIR, as the child saw it
        assert (tmp_path / "up.log").exists() and (logs / "vllm.log").stat().st_size > 0
    finally:
        stop_up(proc)
