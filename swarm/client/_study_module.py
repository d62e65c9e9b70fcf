"""What a study client module is: loading one from its file (``load_study``) and reading its held-out
tasks (``study_heldout``). Shared by the runner (``_study``) and the data probe (``_probe``); the module
contract itself is described in ``_study``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from swarm.client._run_state import Task, check_heldout

__all__ = ["load_study", "study_heldout"]


def load_study(path: str | Path) -> ModuleType:
    """Import a study client module from ``path``; raises ``ValueError`` if it is not one."""
    path = Path(path).resolve()
    main = sys.modules.get("__main__")
    main_file = getattr(main, "__file__", None)
    if main is not None and main_file and Path(main_file).resolve() == path:
        module = main  # `python CLIENT.py`: the module is already running; do not execute it twice
    else:
        if not path.is_file():
            raise ValueError(f"no study client at {path}")
        spec = importlib.util.spec_from_file_location(f"swarm_study_{path.parent.name}_{path.stem}", path)
        if spec is None or spec.loader is None:
            raise ValueError(f"cannot import {path} as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    for name in ("tasks", "workflow"):
        if not callable(getattr(module, name, None)):
            raise ValueError(f"{path} is not a study client: it must define {name}() "
                             "(tasks(seed) -> iterable of dicts with 'task_id'; workflow(ep, task) -> reward)")
    if getattr(module, "heldout", None) is not None and not callable(module.heldout):
        raise ValueError(f"{path}: heldout must be a function returning the held-out tasks (a list of dicts)")
    return module


def study_heldout(module: ModuleType) -> list[Task]:
    """The study's held-out tasks (``[]`` without ``heldout()``); ``ValueError`` if they are malformed."""
    heldout = getattr(module, "heldout", None)
    return check_heldout(heldout()) if callable(heldout) else []
