"""One study on disk, below the graph: where its files live, what they hold, who may write them.

- ``layout``: the paths of one study (``studies/<id>/`` for reviewable text, ``artifacts/<id>/`` for
  heavy outputs) and the rules for study ids.
- ``files``: the study folder's small text files (study.toml, plan.json, experiments/, LOG.md).
- ``state``: the graph state the checkpoint holds; ``budget``: the arithmetic of time, runs and LLM
  use left in it.
- ``store``: the checkpointed state (read-only), the one-writer lock and the stop request, for
  readers that must not load the graph (status, the scheduler, the daemon, watch).
- ``events``: the study's append-only event log (events.jsonl).
- ``datatask``: a user's data file made the study's task; ``flags``: the command line's values read
  into the study's options, deadline and id.

Nothing here imports the graph, its nodes or the context (the nodes use these modules); running a
study's graph under the lock is ``researcher.session.runner``'s, one layer up. This package re-exports
nothing, so importing one module never loads another.
"""
