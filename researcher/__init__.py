"""The autonomous researcher: a LangGraph study graph that turns a topic into controlled RL
experiments on swarm servers, tracks them in MLflow, analyses them and writes a report.

Entry point: ``researcher.cli`` (``researcher start --topic "…"``). The graph is wired in ``graph``;
its nodes (one verb a module) live in ``researcher.nodes``. The packages, by job:

- ``study``: one study on disk: its files, graph state, checkpoint store, event log and budget.
- ``planner``: what to try next: the catalog, the offline and LLM planners and their schema.
- ``runs``: training runs: their records, processes, placement (local or Ray) and the study code's box.
- ``evidence``: from runs to an answer: curves, statistics, effects, verdicts, plots, the run table.
- ``findings``: the typed records, axes and verdict rules every other package is written in.
- ``tracking``: the MLflow side: the tracker, its spool, planner traces and the UI's saved view.
- ``operations``: running studies over time and watching them: scheduler, daemon, watch, status.

At the top: the CLI, the composition root, settings, the context, a study's preparation, the graph,
the session that runs it and the watchdogs; ``ray_entry`` and ``scheduler`` keep old module paths that persisted data names.
"""
