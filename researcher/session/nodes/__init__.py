"""Graph nodes, one verb a module. Each exposes one entry ``(state, ctx) -> dict`` (the keys it changes),
named for what it does: ``frame_topic.frame``, ``plan_experiments.plan_iteration``, ``write_client.write``,
``validate.validate``, ``launch_runs.launch``, ``monitor.poll_runs``, ``analyze.analyze``,
``decide.decide``, ``park.park`` and ``write_report.write``.

Nodes never import each other; shared work lives in the researcher's library packages
(runs, evidence, study, tracking, planner) and ``researcher.session.graph`` wires the nodes together.
"""
