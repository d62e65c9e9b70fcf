"""Workers join a server whose local generator takes its weights as a stream (on GPUs, NCCL from the
trainer into vLLM: no state dict is gathered for it). The pool's workers cannot join a stream, so
after each step they get a state dict exported from the trainer, and only while one is there to take
it: a learner without workers never gathers one.

The real server (in process, on loopback), trainer, `swarm worker` process and letters client; the
one stand-in is how the local generator receives the trainer's weights: NCCL needs GPUs, so the
trainer's tensors are copied straight into the generator's model, which is what a stream delivers.
One stream breaks: the generator is recovered from an exported copy, and the worker gets that version
as well (before the local generator restarts, which on vLLM takes long).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import ROOT, WorkerProcess, study_run, wait_for

from swarm.backends import load_backend
from swarm.local.device_worker import DeviceWorker
from swarm.local.generator import LocalGenerator
from swarm.server import ServerConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "swarm_server"))
from server_harness import RunningServer, launch

LETTERS = ROOT / "studies" / "examples" / "letters"


class StreamedTorch(LocalGenerator):
    """A torch generator with its own model that the trainer streams into (``streams_weights``)."""

    streams_weights = True

    def __init__(self, model: Path, trainer: Any) -> None:
        sampler = load_backend(str(model), ServerConfig(), seed=0)
        super().__init__(sampler, DeviceWorker(sampler, window_s=0.005, max_rows=64))
        self.trainer = trainer
        self.streamed: list[int] = []
        self.break_at: int | None = None  # the stream of this version breaks (NCCL failed mid-send)

    async def load_streamed(self, version: int) -> None:
        if version == self.break_at:
            raise RuntimeError(f"the stream of version {version} broke")

        def receive() -> None:  # the trainer's own tensors, as a stream delivers them (no export)
            self.backend.load_weights(version, self.trainer.model.state_dict())

        await self.worker.call(receive)
        self.streamed.append(version)

    async def start(self) -> None:
        self.worker.start()

    async def close(self) -> None:
        self.worker.stop()


@pytest.fixture()
def streamed_server(tmp_path: Path) -> Iterator[tuple[RunningServer, StreamedTorch, list[int]]]:
    import torch

    from swarm.models.tiny import build_tiny

    torch.set_num_threads(1)
    model = build_tiny(tmp_path / "model", seed=0)
    exports: list[int] = []
    made: list[StreamedTorch] = []

    def generator(trainer: Any) -> StreamedTorch:
        export = trainer.export_weights

        def counted() -> Any:  # every state dict the server gathers from the trainer
            exports.append(trainer.policy_version)
            return export()

        trainer.export_weights = counted
        made.append(StreamedTorch(model, trainer))
        return made[0]

    running = launch(model, tmp_path / "state", generator=generator, mode="sync", group_size=8, batch_groups=2,
                     min_group_size=2, max_tokens=16, lr=1e-3)
    yield running, made[0], exports
    running.stop()


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_workers_join_a_streamed_server_and_get_each_version(
        streamed_server: tuple[RunningServer, StreamedTorch, list[int]], tmp_path: Path) -> None:
    server, local, exports = streamed_server
    assert server.status()["workers"][0]["id"] == "local"
    with study_run(LETTERS / "client.py", server, tmp_path / "run.log") as run:  # type: ignore[arg-type]
        wait_for(lambda: server.status()["step"] >= 2, 120, what="step 2 without workers", proc=run)
        assert exports == [], "a server without workers gathered a state dict"
        assert local.streamed
        in_step = server.core.trainer  # between a step's update and its publication they differ
        wait_for(lambda: local.policy_version == in_step.policy_version, 30, what="the stream at the trainer's version")

        worker = WorkerProcess(server, "w")  # type: ignore[arg-type]
        try:
            worker.start()
            joined = worker.wait_ready()
            joined_at = server.status()["step"]
            local.break_at = server.status()["policy_version"] + 2  # recovered: the worker still gets it
            key = f"pool/logprob_diff_max/{joined['id']}"  # in a step that trained what the worker sampled

            def steps_since_join() -> list[dict[str, Any]]:
                with server.client() as http:
                    return [r for r in http.get("/api/v1/metrics").json() if r["step"] > joined_at]

            wait_for(lambda: len(rows := steps_since_join()) >= 3 and any(key in r["metrics"] for r in rows)
                     and any(r["policy_version"] >= local.break_at for r in rows), 240,  # type: ignore[operator]
                     what="3 steps with the worker, one training its samples, one past the broken stream", proc=run)
            newest = server.status()["policy_version"]  # the client goes on: later versions may follow
            wait_for(lambda: (m := worker.member()) is not None and m["version"] >= newest, 60,
                     what=lambda: f"the worker at version {newest} or newer ({worker.member()})")
            rows = steps_since_join()
        finally:
            worker.stop()
        wait_for(lambda: (m := worker.member()) is None or m["state"] == "dropped", 30, what="the worker gone")
        left_at, gathered = server.status()["step"], len(exports)
        wait_for(lambda: server.status()["step"] >= left_at + 2, 120, what="2 steps after the worker left", proc=run)
        assert len(exports) == gathered, f"state dicts gathered with no worker to take them: {exports}"
    # Sync mode: a step waits for its own push, so each step after the join sent its version out.
    assert rows and all(r["metrics"]["pool/disseminated_version"] == r["policy_version"] for r in rows), rows
    assert all(r["metrics"]["perf/disseminate_bytes"] > 0 for r in rows), rows
    assert len(exports) >= len(rows), exports  # one export per step with a worker (and the joiner's snapshot)
    # The worker served the trainer's own weights: its samples' log-probs match the trainer's recomputation.
    diffs = [r["metrics"][key] for r in rows if key in r["metrics"]]
    assert diffs and max(diffs) < 1e-3, (diffs, rows)
    wait_for(lambda: local.policy_version == in_step.policy_version, 30, what="the stream at the trainer's version")
    broken = next(r for r in rows if r["policy_version"] == local.break_at)
    assert local.break_at not in local.streamed and broken["metrics"]["pool/disseminated_version"] == local.break_at
