"""pydantic-ai: one agent with one tool, run for plain text (``output_type=str``) and for structured output
(``output_type=Sum``). The structured run sends ``tool_choice: "required"`` (its tools plus the
``final_result`` output tool), served by constrained decoding, so the run loops through calls that parse
until the model picks ``final_result`` and the output validates as ``Sum``."""

from __future__ import annotations

import os

from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

runs: list[tuple[int, int]] = []


class Sum(BaseModel):
    """The sum of two integers."""

    total: int


def add(a: int, b: int) -> int:
    """Add two integers."""
    runs.append((a, b))
    return a + b


def main() -> dict:
    provider = OpenAIProvider(base_url=os.environ["SWARM_BASE_URL"], api_key=os.environ["SWARM_RUN_KEY"])
    model = OpenAIChatModel(os.environ["SWARM_MODEL"], provider=provider)
    text = Agent(model, tools=[add]).run_sync("What is 2 + 3?")
    structured = Agent(model, tools=[add], output_type=Sum).run_sync("What is 2 + 3?")
    assert isinstance(structured.output, Sum)
    return {"text": text.output[:200], "structured": structured.output.model_dump(), "add_runs": runs,
            "structured_calls": sum(1 for m in structured.all_messages() if m.kind == "response")}


if __name__ == "__main__":
    print(main())
