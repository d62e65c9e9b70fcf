"""What the tests share: one free port, one condition poller, one harness for the processes a test
starts (``swarm serve``, ``swarm worker``, a script of its own).

Imported as ``support``: pytest puts ``tests/`` on ``sys.path`` when it loads ``tests/conftest.py``
(the default "prepend" import mode), as it does for every test; a script run by hand (``tests/bench``)
inserts ``tests/`` itself. Not ``tests.support``: verl installs a top-level ``tests`` package that
would shadow ours.
"""

from support.serve import ROOT, SWARM, ManagedProcess, ServeProcess, WorkerProcess, study_run
from support.waiting import wait_for
from swarm.ports import free_port

__all__ = ["ROOT", "SWARM", "ManagedProcess", "ServeProcess", "WorkerProcess", "free_port", "study_run", "wait_for"]
