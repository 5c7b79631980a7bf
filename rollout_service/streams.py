"""A reply's text as its tokens arrive: what a streamed chat completion may send now.

The session proxy streams a choice's content while the engine samples it (`ReplyStream`),
and merges the engine streams of `n` choices into one (`merged`). Text sent can never be
taken back, so a stream sends only what the finished reply is sure to begin with:

- the sampled ids are decoded incrementally (a token that ends inside a character waits for
  the next; the closing eos is not text);
- text that could be the start of a stop string waits until it is not; past a stop string
  nothing more is sent (the engine stops on the token completing it);
- with tools, text from where a call begins (the parser's `start` marker, or what could be
  its start) is held, and so is whitespace that could separate the content from a call.

When the reply is complete and parsed, `rest` gives what the content adds to what was sent
(held text, trailing whitespace; a failed call's text). Tool calls are sent whole at the end.

Non-goals: tool-call argument deltas while the call is sampled; rendering OpenAI's chunks
(routes/sessions.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from rollout_service.tokens import Tokenizer
from rollout_service.turns import first_stop


def _held(text: str, marks: Sequence[str]) -> int:
    """Length of the longest end of `text` that is the beginning of one of `marks`."""
    most = 0
    for m in marks:
        for n in range(min(len(m) - 1, len(text)), most, -1):
            if text.endswith(m[:n]):
                most = n
                break
    return most


class ReplyStream:
    """The content of one choice, token by token: `push` ids, get the text safe to send."""

    def __init__(self, tok: Tokenizer, stops: Sequence[str], call_start: str | None = None):
        self.tok, self.stops, self.call_start = tok, [s for s in stops if s], call_start
        self._ids: list[int] = []
        self._text = ""  # the ids decoded so far
        self._prefix = self._read = 0  # incremental decoding: text before _read is in _text
        self._sent = 0  # characters of _text sent

    def push(self, ids: Sequence[int]) -> str:
        """The newly sampled `ids`; returns the text that can go out now ("" if none)."""
        self._ids += [i for i in ids if i != self.tok.eos_id]  # an eos only ever closes the reply
        # Decode from one token before the new ones: some tokenizers need the neighbour to
        # place a leading space, and decoding everything each time would be quadratic.
        before = self.tok.decode(self._ids[self._prefix:self._read])
        now = self.tok.decode(self._ids[self._prefix:])
        if len(now) > len(before) and not now.endswith("\ufffd"):
            self._text += now[len(before):]
            self._prefix, self._read = self._read, len(self._ids)
        return self._release()

    def _release(self) -> str:
        text = self._text
        hit = first_stop(text, self.stops)
        text = text[: hit[0]] if hit else text[: len(text) - _held(text, self.stops)]
        if self.call_start:
            at = text.find(self.call_start)
            text = text[:at] if at >= 0 else text[: len(text) - _held(text, [self.call_start])]
            text = text.rstrip()  # whitespace before a call is not content
        if len(text) <= self._sent:
            return ""
        out, self._sent = text[self._sent:], len(text)
        return out

    @property
    def sent(self) -> str:
        return self._text[: self._sent]

    def rest(self, content: str | None) -> str:
        """What the finished reply's `content` adds to the text sent."""
        content, sent = content or "", self.sent
        # The content always begins with what was sent (see the module docstring); were it
        # ever otherwise, sending nothing more beats sending a garbled tail.
        return content[len(sent):] if content.startswith(sent) else ""


async def merged(streams: Sequence[AsyncIterator], depth: int = 64) -> AsyncIterator[tuple[int, object]]:
    """(k, item) from each of `streams` as they come, in order within each stream. An error in
    one ends it all (raised here); closing this iterator cancels every stream. `depth` bounds
    the items waiting."""
    queue: asyncio.Queue = asyncio.Queue(depth)
    done = object()

    async def pump(k: int, it: AsyncIterator) -> None:
        try:
            async for item in it:
                await queue.put((k, item, None))
            await queue.put((k, done, None))
        except Exception as e:  # handed to the consumer, which raises it
            await queue.put((k, done, e))

    tasks = [asyncio.create_task(pump(k, s)) for k, s in enumerate(streams)]
    try:
        left = len(tasks)
        while left:
            k, item, error = await queue.get()
            if error is not None:
                raise error
            if item is done:
                left -= 1
                continue
            yield k, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
