"""verl plugin entry for CPU workers: ``import verl`` imports this module when it is named in
``VERL_USE_EXTERNAL_MODULES`` (see ``cpu_platform.worker_env``), so the ``cpu`` platform exists
before any verl module asks for the current platform. Importing it is the side effect: do not
import it from anywhere else.
"""

from swarm.backends.verl.cpu_platform import activate

activate()
