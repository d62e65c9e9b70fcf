"""The vLLM generator: rollouts served by a vLLM OpenAI server, fed token ids, weights synced per step.

``VllmGenerator.launch(model_dir, state_dir)`` owns a vLLM child process (found through
``--vllm-python``, ``$SWARM_VLLM_PYTHON`` or ``<project>/.venv-vllm``; ``bash .ci/setup-vllm``
builds that on CPU); ``VllmGenerator.attach(url, model_dir, state_dir)`` uses a running server.
How weights reach it (a folder, or NCCL from where they are) is ``swarm.weights.transfer``, chosen
by ``swarm.weights.wiring``; the generator's own half of a publication is ``publishing``.
Importing this package imports neither torch nor vLLM.
"""

from swarm.backends.vllm.errors import GeneratorUnavailable, VllmStartError, WeightSyncError
from swarm.backends.vllm.generator import VllmGenerator, VllmStatus
from swarm.backends.vllm.process import AttachedVllm, VllmProcess, find_vllm_python

__all__ = [
    "AttachedVllm",
    "GeneratorUnavailable",
    "VllmGenerator",
    "VllmProcess",
    "VllmStartError",
    "VllmStatus",
    "WeightSyncError",
    "find_vllm_python",
]
