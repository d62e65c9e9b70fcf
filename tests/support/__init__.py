"""What the tests share: one free port, one condition poller, one ``swarm serve`` process.

Imported as ``support``: pytest puts ``tests/`` on ``sys.path`` when it loads ``tests/conftest.py``
(the default "prepend" import mode), as it does for every test; a script run by hand (``tests/bench``)
inserts ``tests/`` itself. Not ``tests.support``: verl installs a top-level ``tests`` package that
would shadow ours.
"""

from support.ports import free_port
from support.serve import ROOT, SWARM, ServeProcess, study_run
from support.waiting import wait_for

__all__ = ["ROOT", "SWARM", "ServeProcess", "free_port", "study_run", "wait_for"]
