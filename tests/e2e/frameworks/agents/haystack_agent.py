"""haystack: an ``Agent`` with one tool on ``OpenAIChatGenerator`` (the key read from the environment, as
haystack's ``Secret`` wants)."""

from __future__ import annotations

import os

from haystack.components.agents import Agent
from haystack.components.generators.chat import OpenAIChatGenerator
from haystack.dataclasses import ChatMessage
from haystack.tools import create_tool_from_function
from haystack.utils import Secret

runs: list[tuple[int, int]] = []


def add(a: int, b: int) -> int:
    """Add two integers."""
    runs.append((a, b))
    return a + b


def main() -> dict:
    generator = OpenAIChatGenerator(model=os.environ["SWARM_MODEL"], api_base_url=os.environ["SWARM_BASE_URL"],
                                    api_key=Secret.from_env_var("SWARM_RUN_KEY"))
    agent = Agent(chat_generator=generator, tools=[create_tool_from_function(add)])
    result = agent.run(messages=[ChatMessage.from_user("What is 2 + 3?")])
    return {"answer": str(result["messages"][-1].text)[:200], "add_runs": runs}


if __name__ == "__main__":
    print(main())
