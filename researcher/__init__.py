"""The autonomous researcher: a LangGraph study graph that turns a topic into controlled RL
experiments on swarm servers, tracks them in MLflow, analyses them and writes a report.

Entry point: ``researcher.cli`` (``researcher start --topic "…"``). The packages, by job:

- ``session``: running one study: its preparation, the one composition root, the context, the graph
  (wiring only) and its nodes (one verb a module), the runner that starts and resumes it, the watchdogs.
- ``types``: the types every other package is written in: the study's design, LLM usage, the settings,
  the failures that park or fail a study. It imports nothing of the researcher.
- ``study``: one study on disk: its files, graph state, checkpoint store, event log and budget.
- ``planner``: what to try next: the catalog, the offline and LLM planners and their answers.
- ``runs``: training runs: their records, processes, placement (local or Ray) and the study code's box.
- ``evidence``: from runs to an answer: curves, statistics, effects, verdicts, plots, the run table.
- ``findings``: the typed records, axes and verdict rules of a study's results.
- ``tracking``: the MLflow side: the tracker, its spool, planner traces and the UI's saved view.
- ``operations``: running studies over time and watching them: scheduler, daemon, watch, status.
- ``campaign``: many studies towards one goal: claims, their allocation, the ledger and discovery.

At the top: the CLI, and ``scheduler``, which keeps the module path that scheduled jobs stored before
``researcher.operations.scheduler`` existed name (``researcher.scheduler:run_scheduled_resume``).
"""
