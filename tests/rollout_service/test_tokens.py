from rollout_service.tokens import ByteTokenizer, ChatTokens
from wire import Message


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
