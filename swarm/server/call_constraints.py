"""What a chat call's output is constrained to: the grammar of a forced tool call or a JSON
``response_format`` (``swarm.text.constraints`` builds it), checked before anything is generated.

``tool_choice`` "required" or a named function forces one call in the server's tool-call parser's
wire format, so the reply parses into ``message.tool_calls`` with ``finish_reason`` "tool_calls";
``response_format`` ``json_object``/``json_schema`` (and the Responses API's ``text.format``, which
arrives translated) forces one JSON value. A forced call wins when a request sends both (the reply is
then a call, not the JSON). The grammar travels in every row's ``SamplingParams.grammar``; the
episode's trace marks the tokens sampled under it (``Timeline.constrained``).
"""

from __future__ import annotations

from swarm.protocol import ChatCompletionRequest
from swarm.server.errors import BadRequest
from swarm.text.constraints import check_grammar, response_grammar, tool_call_grammar
from swarm.text.parsers import resolve_tool_parser
from swarm.text.templates import ChatText

__all__ = ["call_grammar"]


def call_grammar(request: ChatCompletionRequest, tool_call_parser: str | None, text: ChatText) -> str | None:
    """The grammar the call's rows sample under (None: unconstrained); a ``BadRequest`` naming the field
    for a constraint that cannot be served (no parser for a forced call, a schema that does not compile)."""
    try:
        grammar = None
        if request.tools and request.tool_choice not in (None, "auto", "none"):
            parser = resolve_tool_parser(tool_call_parser, text.chat_template)
            grammar = tool_call_grammar(request.tools, request.tool_choice, parser, text.added_token_id)
        if grammar is None:
            grammar = response_grammar(request.response_format)
        if grammar is not None:
            check_grammar(grammar)
    except ValueError as exc:
        field = "tool_choice" if request.tool_choice not in (None, "auto", "none") else "response_format"
        message = str(exc)
        raise BadRequest(message if message.startswith(field) else f"{field}: {message}") from None
    return grammar
