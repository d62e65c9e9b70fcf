"""llama-index: a ``FunctionAgent`` with one tool on ``llama_index.llms.openai.OpenAI``, which checks the
model name against OpenAI's before sending anything (so the server serves ``gpt-4o-mini``:
``--served-model-name``) and sends ``temperature: 0.1`` (the server pins it: ``client_sampling = "pin"``)."""

from __future__ import annotations

import asyncio
import os

from llama_index.core.agent.workflow import FunctionAgent
from llama_index.llms.openai import OpenAI

runs: list[tuple[int, int]] = []


def add(a: int, b: int) -> int:
    """Add two integers."""
    runs.append((a, b))
    return a + b


async def _run() -> dict:
    llm = OpenAI(model=os.environ["SWARM_MODEL"], api_base=os.environ["SWARM_BASE_URL"],
                 api_key=os.environ["SWARM_RUN_KEY"])
    agent = FunctionAgent(tools=[add], llm=llm)
    answer = await agent.run("What is 2 + 3?")
    return {"answer": str(answer)[:200], "add_runs": runs}


def main() -> dict:
    return asyncio.run(_run())


if __name__ == "__main__":
    print(main())
