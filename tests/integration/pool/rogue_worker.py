"""A pool worker that serves another model: it acknowledges every published version but keeps its
own random initialisation (seed 7). Run as a process by ``test_pool_mismatch.py``::

    python tests/integration/pool/rogue_worker.py --server URL --port P --state-dir DIR
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from swarm.backends.base import Weights
from swarm.local.generator import LocalGenerator
from swarm.pool.process import build_generator, run_worker
from swarm.pool.worker import WorkerOptions


class RogueGenerator(LocalGenerator):
    """Claims each version and keeps its own weights."""

    async def load_weights(self, version: int, weights: Weights) -> None:
        self.backend.policy_version = version


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--state-dir", type=Path, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    import torch

    torch.set_num_threads(1)
    honest, _ = build_generator("torch", "tiny", args.state_dir / "rogue", seed=7, capacity=16)
    assert isinstance(honest, LocalGenerator)
    token = (args.state_dir / "worker_token").read_text().strip()
    options = WorkerOptions(server=args.server, token=token, engine="torch", capacity=16, model="tiny (seed 7)")
    run_worker(options, RogueGenerator(honest.backend, honest.worker), host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
