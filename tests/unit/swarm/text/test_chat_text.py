"""The text rules every generator shares (``swarm.text.templates.ChatText``) and the reply book drift
repair is built on (``swarm.text.drift``), on the real tiny and tiny-bpe tokenizers."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarm.text.drift import ReplyBook, conversation_keys, reply_message
from swarm.text.parsers import ParsedReply, ToolCall
from swarm.text.templates import ChatText, load_tokenizer, prepare_messages

CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}


@pytest.fixture(scope="module")
def tiny(tiny_dir: Path) -> ChatText:
    return ChatText(load_tokenizer(tiny_dir))


@pytest.fixture(scope="module")
def bpe(bpe_model: Path) -> ChatText:
    return ChatText(load_tokenizer(bpe_model))


def test_string_arguments_are_parsed_before_rendering_and_bad_json_is_named() -> None:
    [prepared] = prepare_messages([{"role": "assistant", "content": None, "tool_calls": [CALL]}])
    assert prepared["tool_calls"][0]["function"]["arguments"] == {"a": 2, "b": 3}
    broken = {**CALL, "function": {"name": "add", "arguments": "{a: 2"}}
    with pytest.raises(ValueError, match=r"messages\[1\]\.tool_calls\[0\]\.function\.arguments is not valid JSON"):
        prepare_messages([{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [broken]}])


def test_the_tail_after_a_reply_is_what_an_append_only_template_adds(tiny: ChatText, bpe: ChatText) -> None:
    for text in (tiny, bpe):
        head = [{"role": "user", "content": "What is 2 + 3?"}]
        messages = [*head, {"role": "assistant", "content": "It is 5."}, {"role": "user", "content": "Thanks!"}]
        tail = text.render_tail(messages, None, None, 1)
        assert tail is not None and text.decode(tail).startswith("\n")  # after <|im_end|> (special, skipped)
        plain = text.render(messages, None)
        # prompt of the first call + the reply's ids + its end token + the tail: the plain rendering
        assert plain == text.render(head, None) + text.encode("It is 5.") + tail


def test_no_splice_when_the_template_drops_the_reply(tiny: ChatText, tiny_dir: Path) -> None:
    tokenizer = load_tokenizer(tiny_dir)
    tokenizer.chat_template = ("{% for m in messages %}{% if m.role != 'assistant' %}{{ m.content }}"
                               "{% endif %}{% endfor %}")
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert ChatText(tokenizer).render_tail(messages, None, None, 1) is None


def test_token_bytes_rebuild_the_text_even_for_partial_characters(tiny: ChatText, bpe: ChatText) -> None:
    assert tiny.token_bytes(ord("a")) == [ord("a")]
    ids = bpe.encode("naïve 🤖 Hello")
    assert b"".join(bytes(bpe.token_bytes(i)) for i in ids).decode() == "naïve 🤖 Hello"
    partial = [i for i in ids if "\ufffd" in bpe.decode([i])]
    assert partial, "the emoji is split across byte tokens that each decode to U+FFFD"
    assert bpe.token_bytes(bpe.encode("<|im_end|>")[0]) == list(b"<|im_end|>")


def test_the_reply_book_finds_the_longest_known_reply_and_forgets_the_oldest() -> None:
    call = ToolCall(name="add", arguments='{"a": 2, "b": 3}', id="call_x")
    reply = ParsedReply(content=None, reasoning="thinking", tool_calls=(call,))
    first = [{"role": "user", "content": "What is 2 + 3?"}]
    book = ReplyBook(capacity=2)
    book.add(conversation_keys(first, None, {})[-1], reply, [1, 2, 3])
    # re-sent as a client does: content "" for None, another id, the arguments re-serialised, no reasoning
    resent = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "other", "type": "function", "function": {"name": "add", "arguments": '{"b":3,"a":2}'}}]}
    second = [*first, resent, {"role": "tool", "tool_call_id": "other", "content": "5"}]
    splice = book.longest(second, conversation_keys(second, None, {}))
    assert splice is not None and splice.index == 1 and splice.tokens == [1, 2, 3]
    # other tools, or an edited call, is another conversation
    assert book.longest(second, conversation_keys(second, [{"type": "function"}], {})) is None
    edited = [*first, {**resent, "tool_calls": [{**resent["tool_calls"][0],
                                                 "function": {"name": "add", "arguments": '{"a": 4}'}}]}]
    assert book.longest(edited, conversation_keys(edited, None, {})) is None
    assert reply_message(reply)["tool_calls"][0]["function"]["arguments"] == '{"a": 2, "b": 3}'
    for i in range(2):  # capacity 2: the first entry is forgotten
        book.add(conversation_keys([{"role": "user", "content": str(i)}], None, {})[-1], reply, [i])
    assert len(book) == 2 and book.longest(second, conversation_keys(second, None, {})) is None
