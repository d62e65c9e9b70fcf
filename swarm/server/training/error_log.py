"""``ErrorLog``: the errors training survives, reported where an operator looks.

A failed update, publication, commit or periodic checkpoint never ends the training loop: it is logged
with its traceback where it happens, then reported here, as an ``error`` event (with ``where``) and as
``last_error`` in ``GET /api/v1/status``. The control routes report a failed manual checkpoint the same
way (``ServerCore.report``).
"""

from __future__ import annotations

from swarm.protocol import LastError
from swarm.server.view import ServerView

__all__ = ["ErrorLog"]


class ErrorLog:
    """The last error training survived, and an ``error`` event for each."""

    def __init__(self, view: ServerView) -> None:
        self._view = view
        self.last: LastError | None = None

    def report(self, where: str, exc: BaseException) -> None:
        """Record an error the server survived: an ``error`` event and the status' ``last_error``."""
        message = str(exc) or type(exc).__name__
        self.last = LastError(where=where, message=message, at=self._view.clock())
        self._view.emit("error", where=where, message=message, step=self._view.step)
