"""verl must see trl as unavailable, on every device: with trl >= 1.x installed, verl's model patching
imports ``AutoModelForCausalLMWithValueHead``, which trl removed, and building the model fails.

A leaf both device paths build on: ``compat`` (the driver, GPU workers through ``_trl_plugin``) and
``cpu_platform`` (CPU workers through ``_cpu_plugin``) call ``hide_trl``.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["TRL_USERS", "hide_trl"]

# Modules that bound verl's ``is_trl_available`` by name at import time.
TRL_USERS = ("verl.models.transformers.monkey_patch", "verl.utils.model")


def _trl_unavailable() -> bool:
    return False


def hide_trl() -> None:
    """Make verl see trl as unavailable, in modules imported already and in those imported later."""
    from verl.utils import import_utils

    import_utils.is_trl_available = _trl_unavailable
    for name in TRL_USERS:
        module: Any = sys.modules.get(name)  # verl's own module, patched by name
        if module is not None and hasattr(module, "is_trl_available"):
            module.is_trl_available = _trl_unavailable
