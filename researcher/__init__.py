"""The autonomous researcher: a LangGraph study graph that turns a topic into controlled RL
experiments on swarm servers, tracks them in MLflow, analyses them and writes a report.

Entry point: ``researcher.cli`` (``researcher start --topic "…"``). The graph is wired in ``graph``;
its nodes (one verb a module) live in ``researcher.nodes``; planners in ``researcher.planner``.
"""
