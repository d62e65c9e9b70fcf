"""The reliability suite's ``swarm serve`` processes, on the shared harness (``support.ServeProcess``).

``start_server(model, state_dir, port=..., token=..., config={...})`` writes the config as TOML, runs
``swarm serve --threads 1`` on it and waits until ``/healthz`` answers; each start logs to its own
``<state_dir>/server-<n>.log``. The load benchmark (tests/bench/bench_load.py) starts its server here too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from support import ServeProcess


def toml(config: dict[str, Any]) -> str:
    """A flat config as TOML (JSON literals are valid TOML for strings, numbers and booleans)."""
    return "".join(f"{key} = {json.dumps(value)}\n" for key, value in config.items())


def start_server(model: Path | str, state_dir: Path, *, port: int, token: str | None = "rel-token",
                 config: dict[str, Any] | None = None, timeout: float = 150.0,
                 extra_args: tuple[str, ...] = ()) -> ServeProcess:
    """``token=None``: no ``--token``; the server reads or generates ``<state_dir>/token``."""
    state_dir.mkdir(parents=True, exist_ok=True)
    config_file = state_dir / "rel-config.toml"
    config_file.write_text(toml(config or {}))
    n = len(list(state_dir.glob("server-*.log")))
    server = ServeProcess(port=port, state_dir=state_dir, config=config_file, model=str(model), given_token=token,
                          log_path=state_dir / f"server-{n}.log", extra_args=("--threads", "1", *extra_args))
    return server.start(timeout)
