"""A real tiny swarm server for researcher tests: `swarm serve --model tiny` on loopback."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def tiny_server(folder: Path, port: int, config: Path, token: str | None = None) -> Iterator[str]:
    """A real `swarm serve --model tiny --config CONFIG` on loopback (state and log in ``folder``); its URL.

    Stopped (SIGTERM, then SIGKILL after 20 s) when the block ends."""
    import httpx

    argv = [sys.executable, "-c", "from swarm.cli import main; main()", "serve", "--model", "tiny", "--port", str(port),
            "--state-dir", str(folder / "swarm-state"), "--config", str(config), "--threads", "1"]
    log_path = folder / "swarm-server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv + (["--token", token] if token else []), cwd=folder, stdout=log,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
