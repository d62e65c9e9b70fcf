"""What survives a crash: the SQLite episode buffer (``store``, its ``store_schema`` and
``store_pruned`` ledger), checkpoints (``checkpoints``), restart recovery (``recovery``), bounded
storage (``retention``), free disk space (``diskspace``) and rollouts to take away (``export``).
It stores the records of ``swarm.server.records`` and imports nothing above them."""
