"""The tool loop the tiny model is taught for the agent-protocol tests (chat and Responses routes).

The server's own supervised route teaches it: a question answered by a *compact* tool call
(``{"name":"add","arguments":{"a":2,"b":3}}``), then the tool's result answered in words. The chat
template re-renders a call from its parsed arguments with spaces, so without drift repair the second
call of the loop could not continue the first one's token timeline.
"""

from __future__ import annotations

from pathlib import Path

from server_harness import launch

ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]
CALL_TEXT = '<tool_call>\n{"name":"add","arguments":{"a":2,"b":3}}\n</tool_call>'
CALL_MESSAGE = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "5"}
ANSWER = "It is 5."


def teach_tools(model: Path, state_dir: Path) -> Path:
    """Weights of ``model`` taught the loop above; the path of their checkpoint."""
    server = launch(model, state_dir)
    try:
        examples = [{"messages": QUESTION, "tools": [ADD], "completion": CALL_TEXT},
                    {"messages": [*QUESTION, CALL_MESSAGE, RESULT], "tools": [ADD], "completion": ANSWER}]
        with server.client() as http:
            sft = http.post("/api/v1/control/sft", json={"examples": examples, "steps": 160, "batch_size": 2,
                                                         "lr": 0.003})
            assert sft.status_code == 200, sft.text
            return Path(http.post("/api/v1/control/checkpoint").json()["detail"]["weights"])
    finally:
        server.stop()
