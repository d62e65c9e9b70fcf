"""Planners: ``offline`` (deterministic, no LLM) and ``llm`` (any OpenAI-compatible endpoint).

Both answer the same steps with the validated models of ``schema``; prompts for the LLM live in
the repository's ``prompts/`` folder, one Markdown template per step (``prompts`` renders them).
What either can propose is the ``catalog``: the example tasks and the server's knobs with their ladders.
A study with an LLM uses ``fallback``: the LLM planner, whose calls ``deadline`` bounds by the study's
deadline, with the offline planner taking any step it fails.
"""
