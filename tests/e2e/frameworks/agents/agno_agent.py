"""agno: an ``Agent`` with one tool on ``OpenAIChat``. agno reports a failed model call in the run's status
rather than raising, so the status is part of the result."""

from __future__ import annotations

import os

from agno.agent import Agent
from agno.models.openai import OpenAIChat

runs: list[tuple[int, int]] = []


def add(a: int, b: int) -> int:
    """Add two integers."""
    runs.append((a, b))
    return a + b


def main() -> dict:
    model = OpenAIChat(id=os.environ["SWARM_MODEL"], base_url=os.environ["SWARM_BASE_URL"],
                       api_key=os.environ["SWARM_RUN_KEY"])
    result = Agent(model=model, tools=[add]).run("What is 2 + 3?")
    return {"status": str(result.status.value), "answer": str(result.content)[:200], "add_runs": runs}


if __name__ == "__main__":
    print(main())
