from rollout_service.tokens import ByteTokenizer, ChatTokens, HFTokenizer, load_tokenizer, loaded_tokenizer
from wire import FunctionCall, Message, ToolCall


def test_continuation_reproduces_full_render():
    tok = ByteTokenizer()
    chat = ChatTokens(tok)
    opening = [Message(role="system", content="be brief"), Message(role="user", content="2+2?")]
    sampled = [*tok.encode("calc: 2+2"), tok.eos_id]
    obs = [Message(role="user", content="result: 4")]
    appended = chat.prompt(opening) + sampled + chat.continuation(sampled, obs)
    full = tok.render([*opening, Message(role="assistant", content="calc: 2+2"), *obs], add_generation_prompt=True)
    assert appended == full


def test_continuation_closes_an_unfinished_reply_with_eos():
    tok = ByteTokenizer()
    chat = ChatTokens(tok)
    cont = chat.continuation(tok.encode("cut off"), [Message(role="user", content="go on")])
    assert cont[0] == tok.eos_id and cont[1:2] == tok.encode("\n")


def test_byte_tokenizer_round_trips_text_and_specials():
    tok = ByteTokenizer()
    assert tok.decode(tok.encode("héllo ✓")) == "héllo ✓"
    assert tok.decode([tok.IM_START, *tok.encode("x"), tok.IM_END]) == "<|im_start|>x<|im_end|>"


# A ChatML template that renders tools itself (Qwen's shape, written here): the system message
# gets the tool signatures, assistant calls are <tool_call> blocks, tool answers are user turns.
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n<tools>{% for t in tools %}{{ '\\n' + (t | tojson) }}{% endfor %}{{ '\\n' }}</tools><|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'system' %}"
    "{% elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}}</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tool_template_tokenizer(folder):
    """A small byte-level BPE tokenizer folder (trained in a second) with `TOOLS_TEMPLATE`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(["add the numbers", '{"name": "add", "arguments": {"a": 2}}', "tool call result"] * 50,
                            trainer=trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", unk_token="<|endoftext|>",
                                  additional_special_tokens=specials)
    tok.chat_template = TOOLS_TEMPLATE
    tok.save_pretrained(folder)
    return HFTokenizer(str(folder))


def test_a_template_with_tools_renders_them_and_appending_still_holds(tmp_path):
    tok = tool_template_tokenizer(tmp_path)
    assert tok.supports_tools and not ByteTokenizer.supports_tools
    chat = ChatTokens(tok)
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]
    opening = [Message(role="system", content="You add."), Message(role="user", content="2+?")]
    prompt = chat.prompt(opening, tools)
    assert tok.decode(prompt).startswith('<|im_start|>system\nYou add.\n\n# Tools\n<tools>\n{"type": "function"')
    said = '<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>'
    sampled = [*tok.encode(said), tok.eos_id]
    answer = [Message(role="tool", content="2", tool_call_id="c0")]
    appended = prompt + sampled + chat.continuation(sampled, answer, tools)
    # the full render of the same conversation, the call as a structured message (arguments as JSON text)
    call = ToolCall(id="c0", function=FunctionCall(name="add", arguments='{"a": 2}'))
    full = chat.prompt([*opening, Message(role="assistant", content="", tool_calls=[call]), *answer], tools)
    assert appended == full


def test_a_tokenizer_is_at_hand_without_a_file_read_once_loaded(tmp_path):
    """`loaded_tokenizer` answers from memory (a name, or a folder loaded before) so the
    worker needs no thread for it; a folder not loaded yet is None, to be loaded off the loop."""
    assert loaded_tokenizer("byte") is load_tokenizer("byte")
    tool_template_tokenizer(tmp_path)  # writes the folder
    assert loaded_tokenizer(str(tmp_path)) is None
    tok = load_tokenizer(str(tmp_path))
    assert loaded_tokenizer(str(tmp_path)) is tok
