"""Grammars of constrained decoding (``swarm.text.constraints``): an object schema that lists its properties
and leaves ``additionalProperties`` unset takes no other keys, as vLLM's structured outputs generate by
default, so a forced call can only name the tool's own arguments (smolagents refuses any other key, and
an untrained model writes one at every chance it is given). Checked on the grammar text and on what
llguidance accepts, token by token, with the tiny preset's tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llguidance import LLMatcher, LLTokenizer

from swarm.text.constraints import closed, compact, json_grammar, response_grammar, tool_call_grammar

ARGS = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}
ADD = {"type": "function", "function": {"name": "add", "parameters": ARGS}}  # no additionalProperties: smolagents'


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path) -> LLTokenizer:
    return LLTokenizer((tiny_dir / "tokenizer.json").read_text())


def _accepts(tokenizer: LLTokenizer, grammar: str, text: str) -> bool:
    """True when ``text`` is a complete reply under ``grammar``."""
    matcher = LLMatcher(tokenizer, LLMatcher.grammar_from_lark(grammar))
    ids = tokenizer.tokenize_str(text)
    return matcher.validate_tokens(ids) == len(ids) and matcher.consume_tokens(ids) and matcher.is_accepting()


def test_objects_that_list_their_properties_are_closed_at_any_depth() -> None:
    schema = {"type": "object", "properties": {
        "point": {"type": "object", "properties": {"x": {"type": "integer"}}},
        "tags": {"type": "array", "items": {"type": "object", "properties": {"t": {"type": "string"}}}},
        "either": {"anyOf": [{"$ref": "#/$defs/Item"}, {"type": "null"}]},
        "open": {"type": "object", "properties": {"k": {"type": "string"}}, "additionalProperties": True},
        "map": {"type": "object", "additionalProperties": {"type": "object", "properties": {"v": {"type": "number"}}}},
        "fixed": {"const": {"properties": {"kept": 1}}},
        "both": {"allOf": [{"properties": {"a": {"type": "object", "properties": {}}}}, {"properties": {"b": {}}}]}},
        "$defs": {"Item": {"type": "object", "properties": {"n": {"type": "integer"}}}}}
    out = closed(schema)
    props = out["properties"]
    assert out["additionalProperties"] is False and props["point"]["additionalProperties"] is False
    assert props["tags"]["items"]["additionalProperties"] is False
    assert out["$defs"]["Item"]["additionalProperties"] is False
    assert props["open"]["additionalProperties"] is True  # the schema's own choice stands
    assert props["map"]["additionalProperties"]["additionalProperties"] is False  # a map whose values are closed
    assert props["fixed"] == {"const": {"properties": {"kept": 1}}}  # data, not a schema
    first, second = props["both"]["allOf"]  # each member open (closed, each would refuse the other's key)
    assert "additionalProperties" not in first and "additionalProperties" not in second
    assert first["properties"]["a"]["additionalProperties"] is False  # but closed inside
    assert closed({"type": "object"}) == {"type": "object"}  # json_object: any keys
    assert "additionalProperties" not in json.dumps(schema["properties"]["point"])  # the caller's schema is untouched


def test_a_forced_call_takes_the_tools_arguments_and_no_other_key(tokenizer: LLTokenizer) -> None:
    markers = {t: tokenizer.tokenize_str(t) for t in ("<tool_call>", "</tool_call>")}
    grammar = tool_call_grammar([ADD], "required", "hermes", lambda t: markers[t][0] if len(markers[t]) == 1 else None)
    assert grammar is not None
    call = '<tool_call>\n{{"name": "add", "arguments": {}}}\n</tool_call>'
    assert _accepts(tokenizer, grammar, call.format('{"a": 2, "b": 3}'))
    assert not _accepts(tokenizer, grammar, call.format('{"a": 2, "b": 3, "c": 4}'))
    assert not _accepts(tokenizer, grammar, call.format('{"a": 2, "bb": 3}'))


def test_json_schema_is_closed_and_json_object_stays_open(tokenizer: LLTokenizer) -> None:
    schema = response_grammar({"type": "json_schema", "json_schema": {"name": "args", "schema": ARGS}})
    assert schema is not None and _accepts(tokenizer, schema, '{"a": 1, "b": 2}')
    assert not _accepts(tokenizer, schema, '{"a": 1, "b": 2, "note": "x"}')
    open_schema = json_grammar({**ARGS, "additionalProperties": True})
    assert _accepts(tokenizer, open_schema, '{"a": 1, "b": 2, "note": "x"}')
    anything = response_grammar({"type": "json_object"})
    assert anything is not None and _accepts(tokenizer, anything, '{"note": "x", "n": [1, {"k": null}]}')


def test_compact_grammars_take_no_blanks_between_json_tokens(tokenizer: LLTokenizer) -> None:
    """What the vLLM engine sends: its llguidance ignores the one-blank pattern, so its JSON goes compact."""
    schema = response_grammar({"type": "json_schema", "json_schema": {"name": "args", "schema": ARGS}})
    assert schema is not None and _accepts(tokenizer, schema, '{"a": 1, "b": 2}')
    assert not _accepts(tokenizer, schema, '{"a":      1, "b": 2}')
    tight = compact(schema)
    assert _accepts(tokenizer, tight, '{"a":1,"b":2}') and not _accepts(tokenizer, tight, '{"a": 1, "b": 2}')
    own = json_grammar({**ARGS, "x-guidance": {"whitespace_pattern": "[ ]*"}})
    assert compact(own) == own  # a schema that chose its own blanks keeps them
