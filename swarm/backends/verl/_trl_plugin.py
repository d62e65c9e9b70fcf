"""verl plugin entry for GPU workers: ``import verl`` imports this module when it is named in
``VERL_USE_EXTERNAL_MODULES`` (see ``compat.worker_env``), so verl sees trl as unavailable before
it builds a model. Importing it is the side effect: do not import it from anywhere else.
"""

from swarm.backends.verl.trl_guard import hide_trl

hide_trl()
