"""The researcher's MLflow side: the writer of a study's experiment and runs (``tracker``), the local
spool of writes made while the store is down (``spool``), the planner's LLM calls as traces
(``llm_traces``) and the saved view MLflow's UI opens (``review_view``).

Given ids, paths and numbers, never the study's files or graph state: the context hands ``llm_traces``
a reader of the checkpointed state, so training runs (which name spooled run ids) can build on this
package. This package re-exports nothing.
"""
