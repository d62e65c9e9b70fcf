"""What a study's question, plan and answer are written in, shared by everything above: the typed
records of plan.json, analysis-<i>.json and the state's summaries (``records``), the axes a learning
curve is measured on (``axes``), and verdicts (``verdicts``): the rules that classify a difference
and the words an answer is given in.

A leaf package: it imports nothing of the researcher, so the planners, the evidence, run records and
the study's files all build on it without a circle (the planner proposes and concludes with these
terms, the evidence computes them). Not the record of a training run: that is ``researcher.runs.record``.
"""
