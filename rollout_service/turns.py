"""One engine call becomes one recorded turn: the one place a `Turn` is built.

The rollout loop (`rollout.py`) and the session proxy (`sessions.py`) both call
`record_turn`. A turn keeps the prompt delta, the sampled ids exactly as sampled (the closing
eos included: it is a token the policy chose), their logprobs, the policy version, the engine
and the timings. The text handed on (to the environment, or back to the agent) is decoded
from the sampled ids less that closing eos (`reply_text`); nothing is re-tokenized.
"""

from __future__ import annotations

from collections.abc import Sequence

from rollout_service.engines.base import GenerateResult
from rollout_service.tokens import Tokenizer
from wire import Trajectory, Turn, TurnTimings


def reply_text(tok: Tokenizer, output_ids: Sequence[int]) -> str:
    """What the model said: its sampled ids decoded, less a closing eos."""
    body = output_ids[:-1] if output_ids and output_ids[-1] == tok.eos_id else output_ids
    return tok.decode(body)


def record_turn(traj: Trajectory, prompt_ids: list[int], res: GenerateResult, tok: Tokenizer, segment: int,
                elapsed_s: float) -> tuple[Turn, str]:
    """Append the turn of one engine call to `traj`; return it and the reply's text.
    `elapsed_s`: wall time of the call, so that what the engine did not report is queue time."""
    turn = Turn(index=len(traj.turns), prompt_ids=prompt_ids, output_ids=res.output_ids,
                output_logprobs=res.logprobs, finish_reason=res.finish_reason, policy_version=res.policy_version,
                engine_id=res.engine_id, segment=segment,
                timings=TurnTimings(prefill_s=res.prefill_s, decode_s=res.decode_s,
                                    queue_s=max(elapsed_s - res.prefill_s - res.decode_s, 0.0)))
    traj.turns.append(turn)
    return turn, reply_text(tok, res.output_ids)
