"""``swarm``: serve a model, run a study client against it, and watch and steer it.

This is the entry point: logging is configured here and, with ``SwarmClient``'s token defaults,
this is the only place the environment is read (``SWARM_TOKEN``, ``SWARM_CLIENT_TOKEN``,
``MLFLOW_TRACKING_URI``). Heavy imports (the server, torch) happen inside ``serve`` only, so every
other verb starts fast and a restarted ``swarm run`` with edited study code is claiming episodes
again within about a second.

Every verb that talks to a server finds its control token as: ``--token``, else ``$SWARM_TOKEN``,
else ``<state-dir>/token`` (written by ``swarm serve`` on loopback). ``swarm run`` claims with the
client token (``swarm.server.auth``): ``$SWARM_CLIENT_TOKEN``, else ``--token``/``$SWARM_TOKEN``, else
``<state-dir>/client_token``, else the control token file; a study's ``setup`` that calls control
routes (a supervised warm-up) uses the control token when one is at hand. ``swarm serve`` keeps both
tokens in its state dir (0700, files 0600), so a restart on the same state dir keeps them. People may
pass ``--token``; tools should pass tokens by environment or file, never on a command line (``ps``
shows it to every user). A missing URL falls back to ``<state-dir>/server.json``, which a running
``swarm serve`` writes.

The verbs live by concern: ``serve`` (host and train a model), ``run`` (a study client or data file),
``observe`` (status, metrics, plan, events), ``steer`` (config and control), ``worker`` (join a
server's generator pool), ``export`` (a state dir's episodes to a file); ``_common`` holds the
app, the consoles and the token and URL rules they share. ``serve``, ``run`` and ``worker`` gather
their options into typed groups (``ServeFlags``, ``RunFlags``, ``WorkerFlags``), each group a panel
of the command's ``--help`` (``_common.grouped``).
"""

from __future__ import annotations

# Each verb module registers its commands on ``app`` when imported, in the order ``--help`` lists them.
# isort: off
from swarm.cli import serve  # noqa: F401
from swarm.cli import run  # noqa: F401
from swarm.cli import observe  # noqa: F401
from swarm.cli import steer  # noqa: F401
from swarm.cli import worker  # noqa: F401
from swarm.cli import export  # noqa: F401
# isort: on
from swarm.cli._common import app

__all__ = ["app", "main"]


def main() -> None:
    app(prog_name="swarm")
