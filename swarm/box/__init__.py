"""The box: an OS-level sandbox for study code (``swarm run CLIENT.py --box``).

Study code runs in bubblewrap namespaces with a seccomp filter. It sees the system's libraries, the
interpreter, the environment, the ``swarm`` package and its study's folder, all read-only. It writes
only its run folder (a private tmpfs of fixed size). It reaches only its server's port, handed in
through a listening socket. It executes no program and makes no process. What it attempts against
these walls is reported as ``sandbox violation: …`` lines. ``docs/guides/operations.md`` ("The box") says
what the box stops and what it does not.

- ``missing()``: None when this machine can build the box, else what is missing.
- ``BoxPlan``: what the box shows (mounts), ``run_boxed_swarm``: run a ``swarm`` command in it.
"""

from swarm.box._plan import BoxPlan
from swarm.box._probe import BoxUnavailable, missing
from swarm.box._run import VIOLATION_PREFIX, run_boxed_swarm, server_address, writable_run_dir

__all__ = ["VIOLATION_PREFIX", "BoxPlan", "BoxUnavailable", "missing", "run_boxed_swarm", "server_address",
           "writable_run_dir"]
