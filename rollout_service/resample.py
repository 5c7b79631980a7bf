"""Model-side replay: ask an engine to sample every recorded turn again, with the recorded
context and the recorded seed, and count the turns whose sampled ids differ.

    verdicts = await resample(records, request, engine, concurrency=8)
    divergence = sum(v.diverged for v in verdicts) / len(verdicts)

Each turn is replayed on its own, teacher-forced: its prompt is the recorded token sequence up
to it (the earlier turns' prompt and sampled ids of its training sample, then its own prompt
ids), so one differing turn does not drag the rest along. Sampling is the batch's, with the
turn's recorded seed and the `max_tokens` the loop allowed (the batch's, cut to the room
`max_total_tokens` left), and the recorded eos as the stop token. An engine with the same
weights that is deterministic for a fixed seed reproduces every turn; where it is not
(batch-dependent numerics, another backend), `diverged` says where, and at which token.

Non-goal: the environment side (`rollout_service.replay`).
"""

from __future__ import annotations

import asyncio
from array import array
from dataclasses import dataclass

from rollout_service.engines.base import Engine, GenerateRequest
from rollout_service.rollout import turn_seed
from wire import RolloutRequest
from wire.recording import RecordedTrajectory


@dataclass(slots=True)
class TurnVerdict:
    trajectory_id: str
    turn: int
    diverged: bool
    first_token: int | None  # index of the first differing sampled id (None: identical)
    recorded: int  # sampled ids recorded
    replayed: int  # sampled ids the engine gave now
    max_logprob_diff: float  # over the common prefix of identical ids


def eos_of(records: list[RecordedTrajectory]) -> int | None:
    """The stop token the loop passed: the last id of any turn that ended on it."""
    for rec in records:
        for t in rec.trajectory.turns:
            if t.finish_reason == "stop" and t.output_ids:
                return t.output_ids[-1]
    return None


def _requests(rec: RecordedTrajectory, request: RolloutRequest, eos: int | None) -> list[tuple[int, GenerateRequest]]:
    out, context, segment, t = [], [], 0, rec.trajectory
    for turn in t.turns:
        if turn.segment != segment:
            segment, context = turn.segment, []
        room = request.max_total_tokens - len(context) - len(turn.prompt_ids)
        seed = turn_seed(request.sampling.seed, t.group_index, t.sample_index, turn.index)
        sampling = request.sampling.model_copy(update={"max_tokens": max(min(request.sampling.max_tokens, room), 1),
                                                       "seed": seed})
        out.append((turn.index, GenerateRequest(context + turn.prompt_ids, sampling,
                                                f"resample-{t.id}-{turn.index}",
                                                [eos] if eos is not None else [])))
        context = context + turn.prompt_ids + turn.output_ids
    return out


async def resample(records: list[RecordedTrajectory], request: RolloutRequest, engine: Engine,
                   concurrency: int = 8) -> list[TurnVerdict]:
    eos, gate = eos_of(records), asyncio.Semaphore(concurrency)

    async def one(rec: RecordedTrajectory, index: int, req: GenerateRequest) -> TurnVerdict:
        async with gate:
            got = await engine.generate(req)
        want = rec.trajectory.turns[index]
        same = 0
        while same < min(len(got.output_ids), len(want.output_ids)) and got.output_ids[same] == want.output_ids[same]:
            same += 1
        diverged = got.output_ids != want.output_ids
        # Recorded logprobs are float32 (wire.packed stores them so): compare at that precision
        fresh = array("f", got.logprobs[:same]).tolist()
        diff = max((abs(a - b) for a, b in zip(fresh, want.output_logprobs[:same])), default=0.0)
        return TurnVerdict(rec.trajectory.id, index, diverged, same if diverged else None, len(want.output_ids),
                           len(got.output_ids), diff)

    jobs = [one(rec, i, req) for rec in records for i, req in _requests(rec, request, eos)]
    return list(await asyncio.gather(*jobs))
