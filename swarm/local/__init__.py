"""The local engine: the model engines a process runs, built from its settings (``engines``), and the
in-process torch model's way of serving (``device_worker``: the one thread that touches the model,
batching requests continuously; ``generator``: ``LocalGenerator``, the ``Generator`` role over it).

Shared by the server (``swarm serve``) and the pool worker (``swarm worker``), so neither imports
the other to run a model.
"""
