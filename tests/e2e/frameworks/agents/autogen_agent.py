"""autogen: an ``AssistantAgent`` with one tool on ``OpenAIChatCompletionClient``, which looks the model name
up in its table of OpenAI models (so the server serves ``gpt-4o-mini``: ``--served-model-name``)."""

from __future__ import annotations

import asyncio
import os

from autogen_agentchat.agents import AssistantAgent
from autogen_ext.models.openai import OpenAIChatCompletionClient

runs: list[tuple[int, int]] = []


async def add(a: int, b: int) -> int:
    """Add two integers."""
    runs.append((a, b))
    return a + b


async def _run() -> dict:
    client = OpenAIChatCompletionClient(model=os.environ["SWARM_MODEL"], base_url=os.environ["SWARM_BASE_URL"],
                                        api_key=os.environ["SWARM_RUN_KEY"])
    try:
        agent = AssistantAgent("assistant", model_client=client, tools=[add])
        result = await agent.run(task="What is 2 + 3?")
    finally:
        await client.close()
    return {"messages": [type(m).__name__ for m in result.messages], "add_runs": runs}


def main() -> dict:
    return asyncio.run(_run())


if __name__ == "__main__":
    print(main())
