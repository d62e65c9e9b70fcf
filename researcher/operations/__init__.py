"""Running studies over time and watching them, from a study's files only: the scheduled resumption
of studies (``scheduler``, its job store and history) and the daemon that runs it (``daemon``), the
event log served as Server-Sent Events (``events_http``), the live view of a study (``watch``), the
overview rows of ``researcher status`` and ``list`` (``overview``) and the terminal output they share
(``terminal``).

Nothing here loads the study graph, its nodes or the context (an import contract holds it): a
scheduled session runs as a subprocess (``researcher resume``), so the daemon and the readers stay
light and a crashing study cannot take them down. This package re-exports nothing.
"""
