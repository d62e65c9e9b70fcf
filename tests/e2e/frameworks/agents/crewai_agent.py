"""crewai: one ``Agent`` with one tool in a one-task ``Crew``, on crewai's ``LLM`` (its native OpenAI
provider, which sends the tool as a function with ``tool_choice: "auto"``)."""

from __future__ import annotations

import os

from crewai import LLM, Agent, Crew, Task
from crewai.tools import tool

runs: list[tuple[int, int]] = []


@tool("add")
def add(a: int, b: int) -> int:
    """Add two integers."""
    runs.append((a, b))
    return a + b


def main() -> dict:
    llm = LLM(model=os.environ["SWARM_MODEL"], base_url=os.environ["SWARM_BASE_URL"],
              api_key=os.environ["SWARM_RUN_KEY"])
    agent = Agent(role="Calculator", goal="Answer sums", backstory="You add numbers.", tools=[add], llm=llm)
    task = Task(description="What is 2 + 3?", expected_output="The sum", agent=agent)
    result = Crew(agents=[agent], tasks=[task]).kickoff()
    return {"answer": str(result)[:200], "add_runs": runs}


if __name__ == "__main__":
    print(main())
