"""smolagents: a ``ToolCallingAgent`` with one tool. It sends ``tool_choice: "required"`` on every step (its
tools plus ``final_answer``), which the server serves by constrained decoding, so every step is a call
that parses: ``add`` runs the Python function, ``final_answer`` ends the run."""

from __future__ import annotations

import os

from smolagents import OpenAIServerModel, ToolCallingAgent, tool

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
    model = OpenAIServerModel(model_id=os.environ["SWARM_MODEL"], api_base=os.environ["SWARM_BASE_URL"],
                              api_key=os.environ["SWARM_RUN_KEY"])
    agent = ToolCallingAgent(tools=[add], model=model, max_steps=4)
    answer = agent.run("What is 2 + 3?")
    steps = [step for step in agent.memory.steps if type(step).__name__ == "ActionStep"]
    return {"answer": repr(answer)[:200], "add_runs": runs, "steps": len(steps),
            "tool_calls": [call.name for step in steps for call in (step.tool_calls or [])],
            "step_errors": [str(step.error)[:300] for step in steps if step.error is not None]}


if __name__ == "__main__":
    print(main())
