"""Model-side replay: each recorded turn re-sampled with its context and seed."""

from __future__ import annotations

from rollout_service.engines.base import GenerateResult
from rollout_service.engines.sim import SimEngine
from rollout_service.recording import read
from rollout_service.resample import eos_of, resample
from tests.rollout_service.test_recording import exported  # noqa: F401 - the fixture


class Recorder:
    """An engine that remembers what it was asked (and answers as `inner`)."""

    def __init__(self, inner):
        self.inner, self.seen = inner, []

    async def generate(self, req) -> GenerateResult:
        self.seen.append(req)
        return await self.inner.generate(req)


async def test_the_same_engine_and_seeds_reproduce_every_turn(exported):  # noqa: F811
    _, out = exported
    header, records = read(out)
    engine = Recorder(SimEngine("again", seed=1))  # the recording's engine: sim-0, seed 1
    verdicts = await resample(records, header.request, engine)
    assert len(verdicts) == sum(len(r.trajectory.turns) for r in records)
    assert not any(v.diverged for v in verdicts) and all(v.max_logprob_diff == 0.0 for v in verdicts)
    # Teacher-forced: turn k's prompt is the recorded sequence up to it, with the recorded seed.
    rec = next(r for r in records if len(r.trajectory.turns) > 1)
    turns = rec.trajectory.turns
    req = next(q for q in engine.seen if q.request_id == f"resample-{rec.trajectory.id}-1")
    assert req.prompt_ids == turns[0].prompt_ids + turns[0].output_ids + turns[1].prompt_ids
    assert req.sampling.seed == rec.steps[1].sampling_seed and req.stop_token_ids == [eos_of(records)]


async def test_other_weights_diverge_and_say_where(exported):  # noqa: F811
    _, out = exported
    header, records = read(out)
    verdicts = await resample(records, header.request, SimEngine("other", seed=2))
    diverged = [v for v in verdicts if v.diverged]
    assert diverged and all(v.first_token is not None and v.first_token <= min(v.recorded, v.replayed)
                            for v in diverged)
