"""One turn as an engine served it: the measurement the allocator's `Capacity` learns from.

Workers report one `TurnTiming` per turn (`Registry.report_timing`, from the fleet, which sees
each request's prefill and decode seconds as vLLM's per-request metrics give them); the
allocation loop takes them (`Registry.take_timings`) and feeds its `Capacity` (`feed`):

- a prefill on an engine that did nothing else at the time (a prefill engine, or a request
  alone on its engine) times `new_tokens` of prefill (`Capacity.observe_prefill`): the tokens
  not in its prefix cache, as far as the worker knows (the turn's prompt delta);
- a decode of `output_tokens` is that many engine steps at a batch of `batch` sequences, each
  holding about `context_tokens` (`Capacity.observe_step`): the batch is what this worker had in
  flight on the engine, a lower bound when several workers share it.

Non-goals: fitting (`scheduler.capacity`), reading vLLM's metrics endpoint.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass

from scheduler.capacity import Capacity


@dataclass(slots=True, frozen=True)
class TurnTiming:
    engine: str
    new_tokens: int  # prompt tokens the engine had to prefill (the turn's delta)
    context_tokens: int  # the whole prompt
    output_tokens: int
    prefill_s: float
    decode_s: float
    batch: int  # requests this worker had in flight on the decode engine, this one included
    split: bool  # prefilled on a prefill engine, decoded on another

    def dumps(self) -> str:
        return ",".join(str(int(v) if isinstance(v, bool) else v) for v in astuple(self))

    @classmethod
    def loads(cls, raw: bytes | str) -> TurnTiming:
        f = (raw.decode() if isinstance(raw, bytes) else raw).split(",")
        if len(f) != 8:
            raise ValueError(f"not a turn timing: {raw!r}")
        return cls(f[0], int(f[1]), int(f[2]), int(f[3]), float(f[4]), float(f[5]), int(f[6]), f[7] == "1")


def feed(capacity: Capacity, timings: list[TurnTiming]) -> int:
    """Teach `capacity` from reported turns; returns how many taught it something."""
    used = 0
    for t in timings:
        if t.prefill_s > 0 and t.new_tokens > 0 and (t.split or t.batch <= 1):
            capacity.observe_prefill(t.new_tokens, t.prefill_s)
            used += 1
        if t.decode_s > 0 and t.output_tokens > 1:
            b = max(t.batch, 1)
            # the first token comes with the prefill: the decode time covers the rest
            capacity.observe_step(b, b * (t.context_tokens + t.output_tokens / 2), 0.0,
                                  t.decode_s / (t.output_tokens - 1))
            used += 1
    return used
