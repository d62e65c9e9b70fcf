"""Graph nodes, one verb a module. Each exposes ``run(state, ctx) -> dict`` (the keys it changes).

Nodes never import each other; shared work lives in the researcher's library modules
(launcher, analysis, study files, tracking, budget) and ``graph.py`` wires the nodes together.
"""
