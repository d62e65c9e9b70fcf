"""Grammars for constrained decoding: what a call's ``tool_choice`` or ``response_format`` forces the
reply to be, as one llguidance Lark grammar string every engine applies.

Agent frameworks send ``tool_choice: "required"`` (smolagents, pydantic-ai), a named function
(instructor's ``Mode.TOOLS``) or ``response_format: json_schema`` (instructor's ``Mode.JSON_SCHEMA``,
OpenAI's structured outputs) and rely on the server to make the reply fit. vLLM and SGLang do it by
masking, at each decode step, the tokens that cannot continue a valid reply; so does the swarm. The
grammar is built here, torch-free, and travels in ``SamplingParams.grammar``: the torch engine
compiles it with llguidance (``swarm.backends.torch.grammar``), the vLLM engine hands the same text to
vLLM's structured outputs (``structured_outputs.grammar``, served by vLLM's llguidance backend).

- ``json_object``: any JSON object. ``json_schema``: its ``schema`` (strict or not: the grammar always
  enforces it). Both use llguidance's ``%json`` with at most one space between JSON tokens: compact
  (``{"a":1}``) and ``json.dumps``' form (``{"a": 1}``) both fit, so a model writes the style it
  learned, and a small or untrained one cannot wander in blanks (vLLM's default allows any run of them).
  vLLM's own llguidance (1.7) ignores that pattern, so the vLLM engine sends the grammar ``compact``: no
  blanks between JSON tokens.
- An object schema that lists its ``properties`` but says nothing of ``additionalProperties`` takes no
  other keys (``closed``), as vLLM's default backend does (xgrammar's strict mode; its llguidance
  backend's ``disable_additional_properties``). JSON Schema's own default admits any key, so a model
  could write a key no tool takes (smolagents' tool schemas and pydantic's leave it unset) and the
  framework refuses the call. A schema that sets ``additionalProperties`` keeps its choice.
- A forced tool call: the tool-call parser's own wire format, so the reply parses into
  ``message.tool_calls`` exactly as a call the model wrote unforced. ``hermes``:
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``; ``llama3_json``:
  ``{"name": ..., "parameters": {...}}``. ``"required"`` allows any of the call's tools (one call a
  reply), a named function only that one; the arguments follow the function's ``parameters`` schema.
  A marker the tokenizer holds as one added token (``<tool_call>`` in Qwen's and the tiny preset's
  vocabularies) is written as that token (``<[id]>``), as the model writes it unforced.

What is constrained is the *sampled distribution*, so the policy's recorded log-probs are those of
the masked distribution (see ``swarm.backends.torch.sampling``); the trainer corrects for the gap
through ``TrainConfig.rollout_is``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["JSON_STYLE", "check_grammar", "closed", "json_grammar", "response_grammar", "tool_call_grammar"]

# llguidance's JSON options: at most one space between JSON tokens (see the module docstring).
JSON_STYLE = {"whitespace_flexible": True, "whitespace_pattern": "[ ]?"}
# llguidance before 1.9 (vLLM 0.32 ships 1.7.6) ignores ``whitespace_pattern``: flexible then means any run of
# blanks, and an untrained model fills max_tokens with them. There the JSON goes compact (no blanks at all).
COMPACT_STYLE = {"whitespace_flexible": False}
TokenLookup = Callable[[str], "int | None"]  # an added token's id by its text (None: not one token)

_HERMES = ("<tool_call>", "</tool_call>")
_CALL_ARGUMENTS = {"hermes": "arguments", "llama3_json": "parameters"}


def json_grammar(schema: Mapping[str, Any]) -> str:
    """The grammar of one JSON value that validates against ``schema``, in ``JSON_STYLE``."""
    return f"start: {_json_rule(schema)}\n"


def response_grammar(response_format: Mapping[str, Any] | None) -> str | None:
    """The grammar an OpenAI ``response_format`` asks for (None for ``text`` or none); ``ValueError``
    for a ``json_schema`` without a schema object."""
    kind = (response_format or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return json_grammar({"type": "object"})
    if kind == "json_schema":
        spec = (response_format or {}).get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if not isinstance(schema, Mapping):
            raise ValueError("response_format.json_schema.schema: a JSON schema object is required")
        return json_grammar(schema)
    raise ValueError(f"response_format.type {kind!r} is not served: text, json_object or json_schema")


def tool_call_grammar(tools: Sequence[Mapping[str, Any]], tool_choice: object, parser: str | None,
                      token_id: TokenLookup) -> str | None:
    """The grammar of a reply that is one call in ``parser``'s wire format, for ``tool_choice``
    "required" (any of ``tools``) or a named function (``{"type": "function", "function": {"name":
    ...}}``); None for "auto", "none" or no choice. ``ValueError`` naming the field for a choice that
    cannot be forced (no tools, an unknown name, no tool-call parser)."""
    if tool_choice is None or tool_choice in ("auto", "none"):
        return None
    functions = {f["name"]: f for f in (_function(i, t) for i, t in enumerate(tools or ()))}
    if not functions:
        raise ValueError("tool_choice: forcing a call needs tools")
    if tool_choice == "required":
        chosen = list(functions.values())
    else:
        name = _chosen_name(tool_choice)
        if name not in functions:
            raise ValueError(f"tool_choice: no tool named {name!r} (tools: {', '.join(functions)})")
        chosen = [functions[name]]
    if parser not in _CALL_ARGUMENTS:
        raise ValueError(f"tool_choice: forcing a call needs a tool-call parser whose format is known "
                         f"({', '.join(_CALL_ARGUMENTS)}); this server's is {parser!r} (--tool-call-parser)")
    key = _CALL_ARGUMENTS[parser]
    calls = [{"type": "object", "additionalProperties": False, "required": ["name", key],
              "properties": {"name": {"const": f["name"]}, key: f.get("parameters") or {"type": "object"}}}
             for f in chosen]
    call = _json_rule(calls[0] if len(calls) == 1 else {"anyOf": calls})
    if parser == "hermes":
        start, end = (_literal(marker, token_id) for marker in _HERMES)
        return f'start: {start} "\\n" {call} "\\n" {end}\n'
    return f"start: {call}\n"


def check_grammar(grammar: str) -> None:
    """``ValueError`` with llguidance's message when ``grammar`` (or a JSON schema in it) is invalid:
    checked before a call is served, so a bad schema is the caller's 400, not a failed generation."""
    from llguidance import LLMatcher  # a Rust extension without dependencies; imported where used

    ok, is_error, messages = _validated(LLMatcher, grammar)
    if is_error or not ok:
        raise ValueError(f"the constraint cannot be compiled: {messages}")


def _validated(matcher: Any, grammar: str) -> tuple[bool, bool, str]:
    try:
        is_error, messages = matcher.validate_grammar_with_warnings(matcher.grammar_from_lark(grammar), None)
    except (ValueError, TypeError) as exc:
        return False, True, str(exc)
    return True, bool(is_error), "; ".join(messages) if isinstance(messages, list) else str(messages)


def _json_rule(schema: Mapping[str, Any]) -> str:
    """``%json {...}``: llguidance's inline JSON-schema rule for ``closed(schema)``, in ``JSON_STYLE``
    unless the schema sets its own."""
    styled = {**closed(schema), "x-guidance": {**JSON_STYLE, **dict(schema.get("x-guidance") or {})}}
    return "%json " + json.dumps(styled, ensure_ascii=False)


# The keywords whose value is a schema, a list of schemas, or a map from names to schemas: where
# ``closed`` looks for objects (``const``, ``enum``, ``default`` and ``examples`` hold data, not schemas).
_SCHEMA_KEYS = ("items", "additionalItems", "contains", "not", "if", "then", "else", "propertyNames",
                "unevaluatedItems", "additionalProperties", "unevaluatedProperties")
_SCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems", "items")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def closed(schema: Mapping[str, Any], *, close: bool = True) -> dict[str, Any]:
    """``schema`` (a copy) with ``"additionalProperties": false`` on every object schema, at any depth,
    that lists ``properties`` or ``patternProperties`` and leaves ``additionalProperties`` unset: what
    vLLM's structured outputs generate by default (see the module docstring). The members of an
    ``allOf`` stay open themselves (closed, each would refuse the keys the others add) but not inside."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _SCHEMA_MAPS and isinstance(value, Mapping):
            out[key] = {name: _closed_value(sub) for name, sub in value.items()}
        elif key in _SCHEMA_KEYS or key in _SCHEMA_LISTS:
            out[key] = _closed_value(value)
        elif key == "allOf" and isinstance(value, list):
            out[key] = [closed(v, close=False) if isinstance(v, Mapping) else v for v in value]
        else:
            out[key] = value
    if close and ("properties" in out or "patternProperties" in out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _closed_value(value: Any) -> Any:
    if isinstance(value, Mapping):
        return closed(value)
    if isinstance(value, list):
        return [closed(v) if isinstance(v, Mapping) else v for v in value]
    return value


def _literal(text: str, token_id: TokenLookup) -> str:
    """A wire marker as the grammar spells it: the added token when the tokenizer has one, else the text."""
    found = token_id(text)
    return f"<[{found}]>" if found is not None else json.dumps(text, ensure_ascii=False)


def _function(index: int, tool: Mapping[str, Any]) -> Mapping[str, Any]:
    function = tool.get("function") if tool.get("type", "function") == "function" else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise ValueError(f"tools[{index}]: a function tool with a name is needed to force a call")
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, Mapping):
        raise ValueError(f"tools[{index}].function.parameters: a JSON schema object is needed")
    return function


def _chosen_name(tool_choice: object) -> str:
    """The function a named ``tool_choice`` forces (chat's nested form, or the Responses API's flat one)."""
    if isinstance(tool_choice, Mapping):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else tool_choice.get("name")
        if tool_choice.get("type", "function") == "function" and isinstance(name, str):
            return name
    raise ValueError(f"tool_choice: 'none', 'auto', 'required' or {{\"type\": \"function\", \"function\": "
                     f"{{\"name\": ...}}}}, not {tool_choice!r}")


def compact(grammar: str) -> str:
    """``grammar`` with its JSON rules in ``COMPACT_STYLE`` where they are in ``JSON_STYLE`` (a schema that set
    its own blanks keeps them): for an llguidance that ignores ``whitespace_pattern`` (vLLM's)."""
    return grammar.replace(json.dumps(JSON_STYLE)[1:-1], json.dumps(COMPACT_STYLE)[1:-1])
