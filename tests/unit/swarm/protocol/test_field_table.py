"""The agents guide's tables of OpenAI request fields ("Routes and request fields") against the openai SDK's own
request types and the server's request models: every field the SDK can send is placed (honoured,
refused or passed over), every field the server declares is in the table, and a field the table calls
honoured or passed over is one the server's model accepts (any other is refused as unknown)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from openai.types.chat import completion_create_params
from openai.types.responses import response_create_params
from pydantic import BaseModel

from swarm.protocol import ChatCompletionRequest
from swarm.protocol.responses import ResponsesRequest

TABLES = Path(__file__).resolve().parents[4] / "docs" / "guides" / "agents.md"
STATUSES = ("honoured", "refused", "passed over")


def _table(marker: str) -> dict[str, set[str]]:
    """Names (every backticked word of a row's first cell) by status, from the table after ``marker``."""
    text = TABLES.read_text()
    assert f"<!-- {marker} -->" in text, f"the agents guide has no <!-- {marker} --> table"
    rows = text.split(f"<!-- {marker} -->", 1)[1].strip().split("\n\n", 1)[0].splitlines()[2:]
    table: dict[str, set[str]] = {status: set() for status in STATUSES}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1] in STATUSES, row
        table[cells[1]] |= set(re.findall(r"`([a-z_]+)`", cells[0]))
    return table


@pytest.mark.parametrize(("marker", "sdk_fields", "model"), [
    ("chat-fields", completion_create_params.CompletionCreateParamsBase.__annotations__, ChatCompletionRequest),
    ("responses-fields", response_create_params.ResponseCreateParamsBase.__annotations__, ResponsesRequest),
])
def test_every_request_field_is_honoured_refused_or_passed_over(marker: str, sdk_fields: dict,
                                                                 model: type[BaseModel]) -> None:
    table = _table(marker)
    placed = set().union(*table.values())
    unplaced = sorted({*sdk_fields, "stream"} - placed)
    assert not unplaced, f"openai SDK fields missing from the agents guide's {marker} table: {unplaced}"
    declared = set(model.model_fields)
    assert not declared - placed, f"{model.__name__} fields missing from the agents guide: {sorted(declared - placed)}"
    accepted = table["honoured"] | table["passed over"]
    assert accepted <= declared, f"the agents guide calls these served but {model.__name__} refuses them: {accepted - declared}"
    assert model.model_config.get("extra") == "forbid"  # anything undeclared is a 400 naming it
