"""``python -m swarm.cli``: the ``swarm`` command."""

import sys

from swarm.cli import main

sys.exit(main())
