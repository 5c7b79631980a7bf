"""Tool calls as text: how a model is told about tools when its chat template cannot say it
(the fallback format), and how the calls it wrote are read back out of its sampled text.

A parser per model family, named by the engine's registration (`EngineInfo.tool_parser`):

    hermes    Hermes / Qwen: one `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` per call
    mistral   Mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`

Each parser also writes its own format: the fallback instructions (a block appended to the
system message, or a system message of its own) and earlier calls rendered back as text. A
template that handles tools itself (`apply_chat_template(..., tools=...)`) gets neither.

Parsing reads text only: the turn keeps the sampled ids, whatever the parse finds. A reply
that opens a call the parser cannot read (bad JSON, no closing tag, an unknown tool) is a
parse failure: the agent gets it as a plain message and the turn records `tool_failure`.

Non-goals: constrained decoding (`tool_choice: "required"` or a named function); parsing
while streaming (a stream sends the content up to a call's `start` as it comes, and the
calls once the whole reply is parsed: `streams.py`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from wire import FunctionCall, Message, ToolCall


@dataclass(slots=True)
class Parsed:
    content: str  # the text around the calls (all of it on a failure)
    calls: list[ToolCall] = field(default_factory=list)
    failure: str | None = None  # why calls that were begun could not be read


class ParseError(ValueError):
    pass


class ToolParser(Protocol):
    name: str
    start: str  # what begins a call in the text: a stream holds the content back from there

    def instructions(self, tools: Sequence[dict]) -> str:
        """The fallback format: how to call these tools, for the system message."""

    def write(self, calls: Sequence[ToolCall]) -> str:
        """Earlier calls as the model would have written them (fallback rendering)."""

    def parse(self, text: str) -> tuple[str, list[dict]] | None:
        """(content, [{"name", "arguments"}]) when the text calls tools, None when it does not;
        raises `ParseError` when it begins a call that cannot be read. The content is the
        text before the first call, less the whitespace before that call (only the trailing
        whitespace: a stream has sent the rest as it came)."""


def _arguments(call: ToolCall) -> Any:
    try:
        return json.loads(call.function.arguments)
    except ValueError:
        return call.function.arguments


def _signatures(tools: Sequence[dict]) -> str:
    return "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)


class Hermes:
    name = "hermes"
    start = "<tool_call>"
    _CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)

    def instructions(self, tools: Sequence[dict]) -> str:
        return ("# Tools\n\nYou may call one or more functions. Their signatures, one JSON object per line, "
                f"within <tools></tools>:\n<tools>\n{_signatures(tools)}\n</tools>\n\n"
                "To call a function, answer with a JSON object holding its name and arguments within "
                '<tool_call></tool_call>:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}'
                "\n</tool_call>")

    def write(self, calls: Sequence[ToolCall]) -> str:
        return "\n".join("<tool_call>\n" + json.dumps({"name": c.function.name, "arguments": _arguments(c)},
                                                      ensure_ascii=False) + "\n</tool_call>" for c in calls)

    def parse(self, text: str) -> tuple[str, list[dict]] | None:
        start = text.find("<tool_call>")
        if start < 0:
            return None
        rest = text[start:]
        blocks = self._CALL.findall(rest)
        if self._CALL.sub("", rest).strip():
            raise ParseError("text outside a closed <tool_call></tool_call> block after the first call")
        return text[:start].rstrip(), [_call_json(b) for b in blocks]


class Mistral:
    name = "mistral"
    MARK = start = "[TOOL_CALLS]"

    def instructions(self, tools: Sequence[dict]) -> str:
        return ("# Tools\n\nYou may call these functions (JSON signatures, one per line):\n"
                f"{_signatures(tools)}\n\nTo call functions, answer {self.MARK} followed by a JSON list of "
                'objects holding their names and arguments: [TOOL_CALLS][{"name": <function-name>, '
                '"arguments": <args-json-object>}]')

    def write(self, calls: Sequence[ToolCall]) -> str:
        return self.MARK + json.dumps([{"name": c.function.name, "arguments": _arguments(c)} for c in calls],
                                      ensure_ascii=False)

    def parse(self, text: str) -> tuple[str, list[dict]] | None:
        start = text.find(self.MARK)
        if start < 0:
            return None
        try:
            calls = json.loads(text[start + len(self.MARK):])
        except ValueError as e:
            raise ParseError(f"calls are not a JSON list: {e}") from None
        if not isinstance(calls, list) or not calls:
            raise ParseError("calls are not a non-empty JSON list")
        return text[:start].rstrip(), [_call_obj(c) for c in calls]


def _call_json(block: str) -> dict:
    try:
        return _call_obj(json.loads(block))
    except ValueError as e:
        raise ParseError(f"a call is not JSON: {e}") from None


def _call_obj(obj: Any) -> dict:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ParseError("a call has no function name")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            raise ParseError(f"arguments of {obj['name']!r} are not JSON") from None
    if not isinstance(args, dict):
        raise ParseError(f"arguments of {obj['name']!r} are not a JSON object")
    return {"name": obj["name"], "arguments": args}


PARSERS: dict[str, ToolParser] = {"hermes": Hermes(), "mistral": Mistral()}


def get_parser(name: str) -> ToolParser:
    try:
        return PARSERS[name]
    except KeyError:
        raise ValueError(f"no tool parser {name!r}; known: {', '.join(PARSERS)}") from None


def read_calls(parser: ToolParser, text: str, tools: Sequence[dict], call_id: Callable[[int], str]) -> Parsed:
    """The tool calls in a reply's text, checked against the offered tools."""
    try:
        found = parser.parse(text)
        if found is None:
            return Parsed(text)
        content, calls = found
        known = {t["function"]["name"] for t in tools}
        for c in calls:
            if c["name"] not in known:
                raise ParseError(f"call of unknown tool {c['name']!r}")
    except ParseError as e:
        return Parsed(text, failure=f"unparsable tool call ({parser.name}): {e}")
    return Parsed(content, [ToolCall(id=call_id(k), function=FunctionCall(
        name=c["name"], arguments=json.dumps(c["arguments"], ensure_ascii=False))) for k, c in enumerate(calls)])


def as_plain(messages: Sequence[Message], tools: Sequence[dict] | None, parser: ToolParser) -> list[Message]:
    """The conversation in the fallback format, for a template with no tool support: the
    instructions join the system message, earlier calls become the assistant's text."""
    out = []
    for m in messages:
        if m.tool_calls:
            text = "\n".join(x for x in (m.content, parser.write(m.tool_calls)) if x)
            m = Message(role=m.role, content=text)
        elif m.tool_call_id is not None:
            m = Message(role=m.role, content=m.content)
        out.append(m)
    if tools:
        block = parser.instructions(tools)
        if out and out[0].role == "system":
            out[0] = Message(role="system", content=f"{out[0].content}\n\n{block}")
        else:
            out.insert(0, Message(role="system", content=block))
    return out
