import json

import pytest

from rollout_service.toolcalls import PARSERS, as_plain, get_parser, read_calls
from wire import FunctionCall, Message, ToolCall

ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}


def ids(k: int) -> str:
    return f"call_{k}"


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_each_parser_reads_back_what_it_writes(name):
    p = get_parser(name)
    calls = [ToolCall(id="c0", function=FunctionCall(name="add", arguments='{"a": 1, "b": 2}')),
             ToolCall(id="c1", function=FunctionCall(name="add", arguments='{"a": 3, "b": 4}'))]
    parsed = read_calls(p, "Adding twice.\n" + p.write(calls), [ADD], ids)
    assert parsed.failure is None and parsed.content == "Adding twice."
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in parsed.calls] == \
        [("call_0", "add", {"a": 1, "b": 2}), ("call_1", "add", {"a": 3, "b": 4})]
    assert "add" in p.instructions([ADD])


def test_text_without_calls_is_content():
    parsed = read_calls(get_parser("hermes"), "just text", [ADD], ids)
    assert (parsed.content, parsed.calls, parsed.failure) == ("just text", [], None)


@pytest.mark.parametrize("name, text, why", [
    ("hermes", '<tool_call>{"name": "add"</tool_call>', "not JSON"),
    ("hermes", '<tool_call>{"name": "add", "arguments": {}}</tool_call> and more', "outside"),
    ("hermes", '<tool_call>{"arguments": {}}</tool_call>', "no function name"),
    ("hermes", '<tool_call>{"name": "add", "arguments": [1]}</tool_call>', "not a JSON object"),
    ("mistral", '[TOOL_CALLS]{"name": "add"}', "non-empty JSON list"),
    ("mistral", '[TOOL_CALLS][{"name": "mul", "arguments": {}}]', "unknown tool 'mul'"),
])
def test_a_call_that_cannot_be_read_is_a_failure_with_the_whole_text(name, text, why):
    parsed = read_calls(get_parser(name), text, [ADD], ids)
    assert parsed.calls == [] and parsed.content == text and why in parsed.failure


def test_unknown_parser_is_named():
    with pytest.raises(ValueError, match="no tool parser 'x'; known: hermes, mistral"):
        get_parser("x")


def test_fallback_puts_tools_in_the_system_message_and_calls_in_the_text():
    p = get_parser("hermes")
    call = ToolCall(id="c0", function=FunctionCall(name="add", arguments='{"a": 1}'))
    msgs = [Message(role="user", content="1+?"), Message(role="assistant", content="", tool_calls=[call]),
            Message(role="tool", content="1", tool_call_id="c0")]
    out = as_plain(msgs, [ADD], p)
    assert out[0].role == "system" and out[0].content == p.instructions([ADD])
    assert out[2] == Message(role="assistant", content=p.write([call]))
    assert out[3] == Message(role="tool", content="1")
    with_system = as_plain([Message(role="system", content="Be brief."), *msgs], [ADD], p)
    assert with_system[0].content == "Be brief.\n\n" + p.instructions([ADD]) and len(with_system) == 4
