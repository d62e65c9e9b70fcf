"""The inference pool: rollout workers behind one server (``pool``, ``members``, ``roster``), the
worker process (``worker``, ``process``) and their wire contract (``wire``). How each new policy
version reaches the workers (shards, the relay chain, the ``Publisher``) is ``swarm.weights``."""
