"""The training side of the server: the step loop (``step_loop``: collect → advantages → update →
publish → commit), a step's metrics (``stepstats``) and their rows (``step_rows``), the bookkeeping a
full disk holds back (``step_commits``), the supervised warm-up (``sft``) and the thread for a trainer
that does not share the device thread (``trainer_thread``)."""
