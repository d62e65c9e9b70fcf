"""The types every layer of the researcher is written in, depending on nothing of the researcher.

- ``design``: the study's design: ``Framing``, ``Factor``, ``Hypothesis``, ``Experiment``, ``Plan``,
  the data task's name and ``same_value`` (config values equal as a server would read them).
- ``usage``: what LLM calls cost (``LLMUsage``, ``LLMCall``), summed into the study's budget.
- ``settings``: ``ResearcherSettings``, ``StudyOptions`` and ``LLMSettings`` (built by the composition
  root, ``researcher.session.composition``).
- ``failures``: the signals that park or fail a study and how an exception is told apart (a full disk,
  an exhausted LLM quota, a transient LLM error).

The planner answers in these types, and the study's files, the evidence, tracking and the campaign read
them, so none of those imports the planner to name a plan (``.importlinter``: ``types-leaf``,
``shared-types-not-planner``).
"""
