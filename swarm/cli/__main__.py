"""``python -m swarm.cli``: the ``swarm`` command."""

from swarm.cli import main

main()
