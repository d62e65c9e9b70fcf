"""Running a real swarm server for tests: the real app and tiny model, uvicorn on a loopback port.

``launch(model_dir, state_dir, **config)`` builds a fresh real ``TorchBackend`` and serves
``create_app`` from a uvicorn thread on a free port; ``RunningServer.stop`` shuts it down. Tests that
need a ``swarm serve`` *process* use ``support.ServeProcess`` instead; waits use ``support.wait_for``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from support import free_port, wait_for

from swarm.server import ServerConfig, ServerSettings, create_app
from swarm.server.core import ServerCore


@dataclass
class RunningServer:
    url: str
    token: str
    core: ServerCore
    state_dir: Path
    server: uvicorn.Server
    thread: threading.Thread

    def client(self, token: str | None = None) -> httpx.Client:
        # 300 s: a synchronous call such as a 160-step ``control/sft`` takes minutes on a shared machine
        # (the tests run two at a time), and a slow answer is not what these tests check.
        return httpx.Client(base_url=self.url, timeout=300.0,
                            headers={"Authorization": f"Bearer {token or self.token}"})

    def status(self) -> dict[str, Any]:
        """``GET /api/v1/status`` as JSON (as ``support.ServeProcess.status``)."""
        with self.client() as http:
            response = http.get("/api/v1/status")
            response.raise_for_status()
            return dict(response.json())

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def launch(model: Path, state_dir: Path, *, seed: int = 0, token: str | None = "test-token",
           max_context: int | None = None, trainer: Any = None, generator: Callable[[Any], Any] | None = None,
           mlflow_uri: str | None = None, disk_reserve_mb: float | None = None, deterministic: bool = False,
           coupled: bool = False, served_model_name: list[str] | None = None, **config: Any) -> RunningServer:
    """``deterministic``, ``coupled``: ``swarm serve --deterministic``, ``--coupled``;
    ``trainer``: compose the server from the loaded backend as generator and this trainer;
    ``generator``: build the generator from the loaded backend, which is then the trainer;
    ``mlflow_uri``: the server writes its MLflow run there (``swarm serve --mlflow-uri``);
    ``disk_reserve_mb``: free space below which claims answer 507 (``swarm serve --disk-reserve-mb``);
    ``served_model_name``: the names the OpenAI routes answer to (``swarm serve --served-model-name``)."""
    from swarm.backends import load_backend

    settings = ServerSettings(model=str(model), host="127.0.0.1", port=free_port(), state_dir=state_dir,
                              token=token, seed=seed, max_context=max_context, mlflow_uri=mlflow_uri,
                              deterministic=deterministic, coupled=coupled, served_model_name=served_model_name,
                              config=ServerConfig().patched(config) if config else ServerConfig(),
                              **({} if disk_reserve_mb is None else {"disk_reserve_mb": disk_reserve_mb}))
    backend = load_backend(settings.model, settings.config, seed=seed)
    if generator is not None:
        app = create_app(settings, generator=generator(backend), trainer=backend)
    else:
        app = create_app(settings, backend, trainer=trainer)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=settings.port, log_level="warning"))
    app.state.request_shutdown = lambda: setattr(server, "should_exit", True)
    thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
    thread.start()
    wait_for(lambda: server.started or not thread.is_alive(), 30, what="the test server to start", interval=0.02)
    if not server.started:
        raise RuntimeError("test server did not start: its uvicorn thread ended")
    return RunningServer(url=f"http://127.0.0.1:{settings.port}", token=app.state.token,
                         core=app.state.ctx.core, state_dir=state_dir, server=server, thread=thread)
