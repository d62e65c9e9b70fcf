"""What happens to an episode once the core admits it: its claim (``claims``), its chat calls
(``completions``: render → generate → record), its heartbeats, finish, abort and expiry
(``lifecycle``), a run key's implicit episodes (``runs``) and held-out evaluation (``evaluation``).
The records they act on live below, in ``swarm.server.records``."""
