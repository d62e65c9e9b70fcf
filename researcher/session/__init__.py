"""A study session: what runs one study's graph for one window, and its one composition root.

- ``preparation``: what ``researcher start`` or ``resume`` was asked, read into the study's settings,
  options, data and context, with every refusal before the study's files are written.
- ``composition``: the composition root: ``ResearcherSettings`` from flags and the environment, and the
  study's collaborators (planner, tracker, launcher, event log) wired into its context.
- ``context``: ``StudyContext``, what every node needs besides the state.
- ``graph``: wiring only: the nodes, edges and retry policies. ``nodes``: one verb a module.
- ``runner``: ``start_study`` and ``resume_study``: the graph run under the study's lock, checkpointed.
- ``watchdogs``: the disk and hung-client checks a days-long study runs.

The readers (status, the scheduler, the daemon, watch) never import this package: they read the
study's files through ``researcher.study``. Nothing here runs at import.
"""
