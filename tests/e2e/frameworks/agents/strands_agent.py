"""strands-agents: an ``Agent`` with one tool on the OpenAI model provider. It streams and sends no
``max_tokens``, so the server gives each reply the rest of the context (or its ``max_tokens`` key)."""

from __future__ import annotations

import os

from strands import Agent, tool
from strands.models.openai import OpenAIModel

runs: list[tuple[int, int]] = []


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    runs.append((a, b))
    return a + b


def main() -> dict:
    model = OpenAIModel(client_args={"base_url": os.environ["SWARM_BASE_URL"], "api_key": os.environ["SWARM_RUN_KEY"]},
                        model_id=os.environ["SWARM_MODEL"])
    result = Agent(model=model, tools=[add], callback_handler=None)("What is 2 + 3?")
    return {"stop_reason": str(result.stop_reason), "answer": str(result)[:200], "add_runs": runs}


if __name__ == "__main__":
    print(main())
