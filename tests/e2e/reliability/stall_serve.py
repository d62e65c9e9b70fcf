"""``python stall_serve.py MODEL STATE_DIR PORT TOKEN CONFIG MARKER``: a real swarm server whose
torch backend stops dead right after its first policy update — after the weights changed, before
the step is published and committed — and writes MARKER so a test knows when to SIGKILL it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import uvicorn

from swarm.backends.torch import TorchBackend
from swarm.config import ServerConfig
from swarm.server import ServerSettings, create_app


class StallAfterUpdate(TorchBackend):
    marker: Path

    def train_step(self, samples, config):  # type: ignore[no-untyped-def]
        metrics = super().train_step(samples, config)
        self.marker.write_text(str(self.policy_version))
        time.sleep(3600)  # the test kills the process here
        return metrics


def main() -> None:
    model, state_dir, port, token, config, marker = sys.argv[1:7]
    torch.set_num_threads(1)
    settings = ServerSettings(model=model, state_dir=Path(state_dir), port=int(port), token=token,
                              config=ServerConfig.from_toml(config))
    StallAfterUpdate.marker = Path(marker)
    backend = StallAfterUpdate.from_model(model, settings.config)
    uvicorn.run(create_app(settings, backend), host="127.0.0.1", port=int(port), log_level="warning")


if __name__ == "__main__":
    main()
