"""Runs one framework's agent (``agents/<name>_agent.py``: a ``main() -> dict``) and prints one JSON line for
the test: what ``main`` returned, or the exception it ended with (its type and the types it was raised
from, outermost first). Usage: ``python observe.py AGENT_FILE``, in ``.venv-frameworks``."""

from __future__ import annotations

import json
import runpy
import sys
import traceback
from typing import Any


def _chain(exc: BaseException | None) -> list[str]:
    seen: list[str] = []
    while exc is not None and len(seen) < 16:
        seen.append(f"{type(exc).__module__}.{type(exc).__qualname__}")
        exc = exc.__cause__ or exc.__context__
    return seen


def main(path: str) -> None:
    outcome: dict[str, Any] = {"result": None, "error": None, "error_chain": []}
    try:
        outcome["result"] = runpy.run_path(path, run_name="agent")["main"]()
    except Exception as exc:
        traceback.print_exc()
        outcome.update(error=f"{type(exc).__name__}: {str(exc)[:2000]}", error_chain=_chain(exc))
    print(json.dumps(outcome, default=repr), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
