"""One engine call becomes one recorded turn: the one place a `Turn` is built.

The rollout loop (`rollout.py`) and the session proxy (`sessions.py`) both call
`record_turn`. A turn keeps the prompt delta, the sampled ids exactly as sampled (the closing
eos included: it is a token the policy chose), their logprobs, the policy version, the engine
and the timings. The text handed on (to the environment, or back to the agent) is decoded
from the sampled ids less that closing eos (`reply_text`); nothing is re-tokenized.

Stop strings: an engine stops on the token that completes a stop string, and that token may
reach past it (a stop string can end mid-token). The turn keeps every sampled id, that last
token whole; the text ends where the stop string begins (as vLLM's own text does), so the ids
may decode to a little more than the text: the stop string and the rest of its last token.
"""

from __future__ import annotations

from collections.abc import Sequence

from rollout_service.engines.base import GenerateResult
from rollout_service.tokens import Tokenizer
from wire import Trajectory, Turn, TurnTimings


def first_stop(text: str, stops: Sequence[str]) -> tuple[int, int] | None:
    """(start, end) of the stop string an engine would have stopped on: the one completed first."""
    hits = [(i + len(s), i) for s in stops if s and (i := text.find(s)) >= 0]
    if not hits:
        return None
    end, start = min(hits)
    return start, end


def reply_text(tok: Tokenizer, output_ids: Sequence[int], stop: Sequence[str] = ()) -> str:
    """What the model said: its sampled ids decoded, less a closing eos, cut where a stop
    string begins (the engine stopped on it)."""
    if output_ids and output_ids[-1] == tok.eos_id:
        return tok.decode(output_ids[:-1])
    text = tok.decode(output_ids)
    hit = first_stop(text, stop)
    return text[: hit[0]] if hit else text


def record_turn(traj: Trajectory, prompt_ids: list[int], res: GenerateResult, tok: Tokenizer, segment: int,
                elapsed_s: float, stop: Sequence[str] = ()) -> tuple[Turn, str]:
    """Append the turn of one engine call to `traj`; return it and the reply's text.
    `elapsed_s`: wall time of the call, so that what the engine did not report is queue time;
    `stop`: the request's stop strings."""
    turn = Turn(index=len(traj.turns), prompt_ids=prompt_ids, output_ids=res.output_ids,
                output_logprobs=res.logprobs, finish_reason=res.finish_reason, policy_version=res.policy_version,
                engine_id=res.engine_id, segment=segment,
                timings=TurnTimings(prefill_s=res.prefill_s, decode_s=res.decode_s,
                                    queue_s=max(elapsed_s - res.prefill_s - res.decode_s, 0.0)))
    traj.turns.append(turn)
    return turn, reply_text(tok, res.output_ids, stop)
