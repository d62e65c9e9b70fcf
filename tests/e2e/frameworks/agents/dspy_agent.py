"""dspy: ``dspy.ReAct`` with one tool. Its first call asks for ``[[ ## field ## ]]`` sections (the
ChatAdapter); a reply without them makes dspy ask again through its JSONAdapter with
``response_format: json_object`` (ReAct's ``next_tool_args`` is an open mapping, so dspy sends no schema),
and a JSON object without ReAct's fields ends the run with ``AdapterParseError``: what an untrained model
gets. ``cache=False``: dspy caches completions by prompt, and a cached answer never reaches the server."""

from __future__ import annotations

import os

import dspy

runs: list[tuple[int, int]] = []


def add(a: int, b: int) -> int:
    """Add two integers."""
    runs.append((a, b))
    return a + b


def main() -> dict:
    lm = dspy.LM(f"openai/{os.environ['SWARM_MODEL']}", api_base=os.environ["SWARM_BASE_URL"],
                 api_key=os.environ["SWARM_RUN_KEY"], cache=False)
    dspy.configure(lm=lm)
    prediction = dspy.ReAct("question -> answer", tools=[add])(question="What is 2 + 3?")
    return {"answer": str(prediction.answer)[:200], "add_runs": runs}


if __name__ == "__main__":
    print(main())
