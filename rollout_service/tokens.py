"""Chat templating and exact token accounting.

The service renders conversations itself and sends token ids to engines (token-in/token-out).
A trajectory grows by appending: the first turn's prompt is the rendered conversation; every
later prompt is the previous prompt + the ids the engine sampled (kept exactly as sampled)
+ a *continuation*: the tokens that close the assistant message and render the new
observation messages plus the generation prompt. Nothing the model produced is ever
re-tokenized.

Two tokenizers: `ByteTokenizer` (bytes + ChatML specials, no dependencies; the simulated
engine speaks it) and `HFTokenizer` (a local transformers tokenizer folder with its own chat
template; needs the `engine` extra).

Tools: a template that renders them (`supports_tools`) gets them through
`render(..., tools=...)`; for one that does not, the session proxy rewrites the messages in a
fallback format first (`rollout_service.toolcalls.as_plain`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from functools import lru_cache
from typing import Protocol

from wire import Message

# A fixed conversation rendered before the new messages, so that a template's
# "continuation" can be measured as a suffix: render(BASE + new) minus render(BASE).
_BASE = [Message(role="system", content="s"), Message(role="user", content="u")]


class Tokenizer(Protocol):
    eos_id: int
    supports_tools: bool  # render() takes tools=[...] (optional: absent means False)

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    def render(self, messages: Sequence[Message], add_generation_prompt: bool) -> list[int]: ...


class ByteTokenizer:
    """UTF-8 bytes are ids 0..255; ChatML specials follow. Deterministic and dependency-free."""

    ENDOFTEXT, IM_START, IM_END = 256, 257, 258
    vocab_size = 259
    eos_id = IM_END
    supports_tools = False  # the proxy writes tools into the messages (toolcalls.as_plain)
    _specials = {ENDOFTEXT: "<|endoftext|>", IM_START: "<|im_start|>", IM_END: "<|im_end|>"}

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        out, buf = [], bytearray()
        for i in ids:
            if i < 256:
                buf.append(i)
                continue
            out.append(buf.decode("utf-8", errors="replace"))
            buf.clear()
            out.append(self._specials.get(i, ""))
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)

    def render(self, messages: Sequence[Message], add_generation_prompt: bool, tools=None) -> list[int]:
        ids: list[int] = []
        for m in messages:
            ids += [self.IM_START, *self.encode(f"{m.role}\n{m.content}"), self.IM_END, *self.encode("\n")]
        if add_generation_prompt:
            ids += [self.IM_START, *self.encode("assistant\n")]
        return ids


class HFTokenizer:
    """A transformers tokenizer loaded from a local folder (never from a hub)."""

    def __init__(self, path: str):
        from transformers import AutoTokenizer  # engine extra

        self._tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        eos = self._tok.convert_tokens_to_ids("<|im_end|>")
        self.eos_id = eos if isinstance(eos, int) and eos != self._tok.unk_token_id else self._tok.eos_token_id
        self.supports_tools = "tools" in str(self._tok.chat_template or "")

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def render(self, messages: Sequence[Message], add_generation_prompt: bool, tools=None) -> list[int]:
        # return_dict=False: transformers 5 otherwise returns a BatchEncoding.
        extra = {"tools": list(tools)} if tools else {}
        return list(self._tok.apply_chat_template([_template_dict(m) for m in messages], tokenize=True,
                                                  add_generation_prompt=add_generation_prompt, return_dict=False,
                                                  **extra))


def _template_dict(m: Message) -> dict:
    """A message as chat templates read it: absent fields left out, call arguments as objects."""
    d = m.model_dump(exclude_none=True)
    for call in d.get("tool_calls", ()):
        try:
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
        except ValueError:
            pass  # not JSON: the template gets the text
    return d


_NAMED: dict[str, Tokenizer] = {"byte": ByteTokenizer()}


def register_tokenizer(name: str, tokenizer: Tokenizer) -> None:
    """Make `tokenizer` available under `name` (an engine's `tokenizer` field)."""
    _NAMED[name] = tokenizer


_LOADING = threading.Lock()  # one load at a time: concurrent first imports of transformers race


def load_tokenizer(spec: str) -> Tokenizer:
    """A registered name ('byte' is built in), otherwise a local tokenizer folder."""
    if spec in _NAMED:
        return _NAMED[spec]
    with _LOADING:
        return _load_folder(spec)


def loaded_tokenizer(spec: str) -> Tokenizer | None:
    """The tokenizer if it is at hand without reading a file (a name, or a folder loaded
    before), else None: then `load_tokenizer` it, off the event loop."""
    return _NAMED.get(spec) or _LOADED.get(spec)


_LOADED: dict[str, Tokenizer] = {}  # what `_load_folder` holds, for `loaded_tokenizer`


@lru_cache(maxsize=16)
def _load_folder(path: str) -> Tokenizer:
    tok = _LOADED[path] = HFTokenizer(path)
    if len(_LOADED) > 16:  # as many as the cache keeps
        del _LOADED[next(iter(_LOADED))]
    return tok


class TemplateDriftError(ValueError):
    """The chat template rewrites an earlier prefix, so appending would corrupt the sample."""


class ChatTokens:
    """Builds a trajectory's prompts by appending, for one tokenizer and its template."""

    def __init__(self, tokenizer: Tokenizer):
        self.tok = tokenizer
        base = tokenizer.render(_BASE, add_generation_prompt=False)
        probe = tokenizer.render([*_BASE, Message(role="assistant", content="x")], add_generation_prompt=False)
        x_ids = tokenizer.encode("x")
        gen = tokenizer.render(_BASE, add_generation_prompt=True)
        # What the template puts after an assistant message's eos (e.g. "\n" in ChatML).
        tail = probe[len(gen) + len(x_ids) :]
        if probe[: len(gen)] != gen or not tail or tail[0] != tokenizer.eos_id:
            raise TemplateDriftError("chat template does not end assistant messages with the eos token")
        self._after_eos = tail[1:]
        self._base_len = len(base)
        self._base = base

    def prompt(self, messages: Sequence[Message], tools: Sequence[dict] | None = None) -> list[int]:
        return self.tok.render(messages, add_generation_prompt=True, **({"tools": tools} if tools else {}))

    def continuation(self, output_ids: Sequence[int], new_messages: Sequence[Message],
                     tools: Sequence[dict] | None = None) -> list[int]:
        """Tokens to append after `output_ids` so the next prompt holds `new_messages` (with
        `tools`, as the template renders them: the prefix is measured with them too)."""
        closing = list(self._after_eos) if output_ids and output_ids[-1] == self.tok.eos_id else [
            self.tok.eos_id,
            *self._after_eos,
        ]
        with_tools = {"tools": tools} if tools else {}
        base = self.tok.render(_BASE, add_generation_prompt=False, **with_tools) if tools else self._base
        full = self.tok.render([*_BASE, *new_messages], add_generation_prompt=True, **with_tools)
        if full[: len(base)] != base:
            raise TemplateDriftError("rendering new messages changed the earlier prefix")
        return closing + full[len(base) :]


@lru_cache(maxsize=32)
def chat_tokens(tokenizer: Tokenizer) -> ChatTokens:
    """The `ChatTokens` of a tokenizer, built once: probing the template renders three times."""
    return ChatTokens(tokenizer)
