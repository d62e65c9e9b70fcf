"""Tool-call and reasoning parsers on real-looking model outputs, and the streaming invariant: the
deltas ``ReplyStream`` emits add up to exactly what ``parse_reply`` returns for the final text."""

from __future__ import annotations

import json
import random
import re

import pytest

from swarm.text.parsers import (
    REASONING_PARSERS,
    TOOL_CALL_PARSERS,
    ParsedReply,
    ReplyStream,
    ToolCall,
    check_parser_names,
    parse_reply,
    resolve_tool_parser,
)

ADD = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
MUL = '<tool_call>\n{"name": "mul", "arguments": {"a": 4, "b": 5}}\n</tool_call>'


def calls(reply: ParsedReply) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in reply.tool_calls]


def hermes(text: str, **kwargs) -> ParsedReply:
    return parse_reply(text, tool_parser="hermes", reasoning_parser=None, **kwargs)


def llama(text: str) -> ParsedReply:
    return parse_reply(text, tool_parser="llama3_json", reasoning_parser=None)


# --- hermes -------------------------------------------------------------------------------------


def test_hermes_single_call_as_qwen25_writes_it():
    reply = hermes(ADD)
    assert reply.content is None and reply.reasoning is None and reply.parse_error is None
    assert calls(reply) == [("add", {"a": 2, "b": 3})]
    call = reply.tool_calls[0]
    assert call.arguments == '{"a": 2, "b": 3}'
    assert re.fullmatch(r"call_[0-9a-f]{24}", call.id)


def test_hermes_parallel_calls_get_distinct_ids():
    reply = hermes(ADD + "\n" + MUL)
    assert calls(reply) == [("add", {"a": 2, "b": 3}), ("mul", {"a": 4, "b": 5})]
    assert reply.tool_calls[0].id != reply.tool_calls[1].id
    assert reply.content is None


def test_hermes_parallel_tool_calls_false_keeps_the_first_and_returns_the_rest_as_content():
    reply = hermes("Two calls.\n" + ADD + "\n" + MUL, parallel_tool_calls=False)
    assert calls(reply) == [("add", {"a": 2, "b": 3})]
    assert reply.content == "Two calls.\n" + MUL and reply.extra_calls == 1
    assert hermes(ADD, parallel_tool_calls=False).extra_calls == 0


def test_llama3_parallel_tool_calls_false_returns_the_rest_as_content():
    text = '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {"y": 2}}'
    reply = parse_reply(text, tool_parser="llama3_json", reasoning_parser=None, parallel_tool_calls=False)
    assert calls(reply) == [("a", {"x": 1})]
    assert reply.content == '{"name": "b", "parameters": {"y": 2}}' and reply.extra_calls == 1


def test_hermes_text_before_a_call_is_content_right_stripped_and_text_after_is_dropped():
    reply = hermes("Let me add them.\n\n" + ADD + "\nDone!")
    assert reply.content == "Let me add them."
    assert calls(reply) == [("add", {"a": 2, "b": 3})]


def test_hermes_unterminated_last_call_with_complete_json_is_accepted():
    reply = hermes(ADD + '\n<tool_call>\n{"name": "mul", "arguments": {"a": 1}}\n')
    assert calls(reply) == [("add", {"a": 2, "b": 3}), ("mul", {"a": 1})]


def test_hermes_arguments_as_json_string_and_unicode_kept():
    reply = hermes('<tool_call>{"name": "say", "arguments": "{\\"text\\": \\"héllo ✓\\"}"}</tool_call>')
    assert reply.tool_calls[0].arguments == '{"text": "héllo ✓"}'


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ('{"name": "add", "arguments": {"a": 2,', "not valid JSON"),
        ('{"arguments": {"a": 2}}', '"name"'),
        ('{"name": "add", "arguments": [2, 3]}', "not a JSON object"),
        ('{"name": "add"}', '"arguments"'),
        ('["add"]', "not a JSON object"),
    ],
)
def test_hermes_broken_call_keeps_the_text_as_content(body: str, reason: str):
    text = f"Calling.\n<tool_call>\n{body}\n</tool_call>"
    reply = hermes(text)
    assert reply.content == text and reply.tool_calls == ()
    assert reply.parse_error is not None and reason in reply.parse_error


def test_hermes_one_bad_call_among_good_ones_fails_the_whole_reply():
    text = ADD + "\n<tool_call>{oops}</tool_call>"
    reply = hermes(text, parallel_tool_calls=False)
    assert reply.tool_calls == () and reply.content == text and "tool call 2" in (reply.parse_error or "")


def test_hermes_unterminated_call_with_truncated_json_is_an_error():
    reply = hermes('<tool_call>\n{"name": "add", "argu')
    assert reply.parse_error is not None and "</tool_call>" in reply.parse_error


def test_without_a_call_marker_text_is_returned_unchanged():
    assert hermes("  Just text.\n") == ParsedReply(content="  Just text.\n", reasoning=None)
    assert hermes("") == ParsedReply(content=None, reasoning=None)


def test_no_tool_parser_never_parses_calls():
    reply = parse_reply(ADD, tool_parser=None, reasoning_parser=None)
    assert reply == ParsedReply(content=ADD, reasoning=None)


# --- llama3_json --------------------------------------------------------------------------------


def test_llama3_python_tag_with_parameters():
    reply = llama('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}')
    assert reply.content is None and reply.parse_error is None
    assert calls(reply) == [("get_weather", {"city": "Paris"})]


def test_llama3_semicolon_separated_calls_without_tag():
    reply = llama('\n{"name": "a", "parameters": {"x": 1}}; {"name": "b", "arguments": {"y": [1, 2]}};\n')
    assert calls(reply) == [("a", {"x": 1}), ("b", {"y": [1, 2]})]


@pytest.mark.parametrize(
    "text",
    ['{"name": "a", "parameters": {"x": 1}} and then some prose', '{"city": "Paris"}', "<|python_tag|>print(1)", "{"],
)
def test_llama3_text_that_starts_like_a_call_but_fails_is_content_with_error(text: str):
    reply = llama(text)
    assert reply.content == text and reply.tool_calls == () and reply.parse_error


def test_llama3_prose_is_content():
    text = 'The JSON is {"name": "a", "parameters": {}}.'
    assert llama(text) == ParsedReply(content=text, reasoning=None)


# --- reasoning ----------------------------------------------------------------------------------


def test_qwen3_reasoning_then_tool_call():
    reply = parse_reply("<think>plan</think>\n\n" + ADD, tool_parser="hermes", reasoning_parser="qwen3")
    assert reply.reasoning == "plan" and reply.content is None
    assert calls(reply) == [("add", {"a": 2, "b": 3})]


def test_qwen3_reasoning_then_broken_call_keeps_reasoning_and_content():
    text = "<think>plan</think>\n\n<tool_call>{]</tool_call>"
    reply = parse_reply(text, tool_parser="hermes", reasoning_parser="qwen3")
    assert reply.reasoning == "plan" and reply.content == "\n\n<tool_call>{]</tool_call>" and reply.parse_error


@pytest.mark.parametrize(
    ("text", "reasoning", "content"),
    [
        ("<think>\nhmm\n</think>\n\nThe answer is 5.", "\nhmm\n", "\n\nThe answer is 5."),
        ("\n<think>a</think>b", "a", "b"),
        ("<think>cut off mid", "cut off mid", None),
        ("<think></think>", None, None),
        ("No thinking here.", None, "No thinking here."),
        ("Before <think>x</think>", None, "Before <think>x</think>"),
    ],
)
def test_qwen3(text: str, reasoning: str | None, content: str | None):
    reply = parse_reply(text, tool_parser=None, reasoning_parser="qwen3")
    assert (reply.reasoning, reply.content) == (reasoning, content)


@pytest.mark.parametrize(
    ("text", "reasoning", "content"),
    [
        ("step 1, step 2</think>\n\nAnswer: 4", "step 1, step 2", "\n\nAnswer: 4"),
        ("<think>step</think>Answer", "step", "Answer"),
        ("still thinking", "still thinking", None),
        ("</think>direct", None, "direct"),
    ],
)
def test_deepseek_r1(text: str, reasoning: str | None, content: str | None):
    reply = parse_reply(text, tool_parser=None, reasoning_parser="deepseek_r1")
    assert (reply.reasoning, reply.content) == (reasoning, content)


# --- names --------------------------------------------------------------------------------------


def test_known_names_pass_and_unknown_names_are_listed():
    for tool in (None, "auto", "none", *TOOL_CALL_PARSERS):
        for reasoning in (None, "none", *REASONING_PARSERS):
            check_parser_names(tool, reasoning)
    with pytest.raises(ValueError, match=r"'mistral'.*hermes.*llama3_json"):
        check_parser_names("mistral", None)
    with pytest.raises(ValueError, match=r"'r2'.*qwen3.*deepseek_r1"):
        check_parser_names("hermes", "r2")
    with pytest.raises(ValueError, match="resolve"):
        parse_reply("x", tool_parser="auto", reasoning_parser=None)


def test_auto_resolution_reads_the_chat_template():
    qwen = "{% for tool in tools %}...{% endfor %}<tool_call>\n{{ tool_call | tojson }}\n</tool_call>"
    llama31 = "<|start_header_id|>ipython<|end_header_id|>{{ x }}<|eot_id|>{{ '<|python_tag|>' }}"
    assert resolve_tool_parser("auto", qwen) == "hermes"
    assert resolve_tool_parser("auto", llama31) == "llama3_json"
    assert resolve_tool_parser("auto", "{{ messages }}") is None
    assert resolve_tool_parser("auto", None) is None
    assert resolve_tool_parser("none", qwen) is None and resolve_tool_parser(None, qwen) is None
    assert resolve_tool_parser("llama3_json", qwen) == "llama3_json"
    with pytest.raises(ValueError):
        resolve_tool_parser("bogus", qwen)


# --- streaming ----------------------------------------------------------------------------------

FRAGMENTS = [
    "Sure", " ", "  ", "\n", "\n\n", "ok.", "é✓🙂", "<", "{", "}", ";", "; ",
    "<think>", "</think>", "<thi", "</thi", "<tool_call>", "</tool_call>", "<tool_c", "</tool_",
    "<|python_tag|>", "<|python", '"name"',
    '{"name": "add", "arguments": {"a": 2, "b": 3}}',
    '{"name": "f", "parameters": {"q": "é"}}',
    '{"name": "add", "arguments": {"a": 2,',
    '{"arguments": {}}',
    "\n" + ADD, MUL,
]
# Replies mostly start like real ones (a think block, a call), so every branch is reached often.
OPENERS = ["", "", "<think>", "<think>\n", " \n<think>", "<|python_tag|>", " {", '{"name": "g", "parameters": {}}; ']
PARSER_PAIRS = [(t, r) for t in (None, *TOOL_CALL_PARSERS) for r in (None, *REASONING_PARSERS)]


def stream(
    text: str, cuts: list[int], tool_parser: str | None, reasoning_parser: str | None
) -> tuple[str, str, ParsedReply]:
    """Feed growing prefixes ending at ``cuts``, then finish; the concatenated deltas and the parse."""
    reply_stream = ReplyStream(tool_parser=tool_parser, reasoning_parser=reasoning_parser)
    reasoning, content = "", ""
    for cut in cuts:
        r, c = reply_stream.push(text[:cut])
        reasoning, content = reasoning + r, content + c
    parsed = parse_reply(text, tool_parser=tool_parser, reasoning_parser=reasoning_parser)
    r, c = reply_stream.finish(parsed)
    return reasoning + r, content + c, parsed


def test_streaming_a_reasoning_and_tool_call_reply_holds_back_the_call():
    text = "<think>plan</think>\n\nI will add.\n" + ADD
    reply_stream = ReplyStream(tool_parser="hermes", reasoning_parser="qwen3")
    assert reply_stream.push("<thi") == ("", "")
    assert reply_stream.push("<think>pl") == ("pl", "")
    assert reply_stream.push("<think>plan</th") == ("an", "")
    assert reply_stream.push("<think>plan</think>\n\nI will add.\n<tool_") == ("", "\n\nI will add.")
    assert reply_stream.push(text) == ("", "")
    parsed = parse_reply(text, tool_parser="hermes", reasoning_parser="qwen3")
    assert reply_stream.finish(parsed) == ("", "")
    assert parsed.content == "\n\nI will add." and len(parsed.tool_calls) == 1


def test_streaming_a_broken_call_releases_it_as_content_at_the_end():
    text = "Hi <tool_call>{bad}</tool_call>"
    reply_stream = ReplyStream(tool_parser="hermes", reasoning_parser=None)
    assert reply_stream.push(text) == ("", "Hi")
    assert reply_stream.finish(hermes(text)) == ("", " <tool_call>{bad}</tool_call>")


def test_streamed_deltas_always_add_up_to_the_final_parse():
    """Thousands of random replies from marker-heavy fragments, every parser pair, random cuts
    (including every character for short texts): the streamed fields equal the final ones."""
    rng = random.Random(1234)
    for case in range(2500):
        text = rng.choice(OPENERS) + "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 8)))
        if case % 10 == 0:
            cuts = list(range(len(text) + 1))
        else:
            cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(1, 12))))
        for tool_parser, reasoning_parser in PARSER_PAIRS:
            reasoning, content, parsed = stream(text, cuts, tool_parser, reasoning_parser)
            assert (reasoning, content) == (parsed.reasoning or "", parsed.content or ""), (
                text, tool_parser, reasoning_parser, cuts
            )


def test_tool_call_is_a_frozen_value():
    call = ToolCall(name="f", arguments="{}", id="call_" + "0" * 24)
    with pytest.raises(AttributeError):
        call.name = "g"  # type: ignore[misc]
