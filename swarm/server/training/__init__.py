"""The training side of the server: one step read top to bottom (``step.train_step``: collect →
advantages → update → publish → commit, with the step's rewards and metrics), the loop that decides when
a step runs (``step_loop``), the committed steps' record (``ledger``) and their metrics rows (``step_rows``),
the publication of new weights to the generator (``generator_sync``), the errors training survives
(``error_log``), the supervised warm-up (``sft``) and where the trainer's blocking calls run
(``trainer_thread``)."""
