"""Checkpoint directories: atomic publication, pruning, and survival of a SIGKILL mid-write."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from swarm.server.durability.checkpoints import CheckpointError, CheckpointManager

ROOT = Path(__file__).resolve().parents[4]


def _writer(payload: str):
    def write(directory: Path) -> None:
        (directory / "model.bin").write_text(payload)
        (directory / "optim.bin").write_text(payload[::-1])

    return write


def test_save_latest_and_meta(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "ckpt", keep=3)
    assert manager.latest() is None
    path = manager.save(4, 4, _writer("w4"), {"cursor": {"last_seq": 17, "trained_step": 4}}, config={"lr": 0.001})
    assert path == tmp_path / "ckpt" / "step-4"
    latest = manager.latest()
    assert latest is not None
    assert (latest.step, latest.policy_version) == (4, 4)
    assert latest.server_state == {"cursor": {"last_seq": 17, "trained_step": 4}}
    assert latest.config == {"lr": 0.001}
    assert (latest.weights_dir / "model.bin").read_text() == "w4"
    assert CheckpointManager.load_meta(path) == latest
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == ["step-4"]  # no temp dirs left


def test_a_checkpoint_written_before_the_rename_keeps_its_server_state(tmp_path: Path) -> None:
    """Checkpoints of 0.1 and before call the server state ``engine_state`` in ``meta.json``."""
    path = CheckpointManager(tmp_path).save(2, 2, _writer("w2"), {"cursor": 5, "config_version": 3})
    meta = json.loads((path / "meta.json").read_text())
    meta["engine_state"] = meta.pop("server_state")
    (path / "meta.json").write_text(json.dumps(meta))
    assert CheckpointManager.load_meta(path).server_state == {"cursor": 5, "config_version": 3}


def test_prunes_to_keep_and_orders_numerically(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep=2)
    for step in (1, 2, 9, 10):
        manager.save(step, step, _writer(f"w{step}"), {})
    assert [c.step for c in manager.all()] == [9, 10]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-10", "step-9"]
    assert manager.latest().step == 10


def test_saving_a_step_again_replaces_it(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    manager.save(3, 3, _writer("old"), {"n": 1})
    manager.save(3, 3, _writer("new"), {"n": 2})
    latest = manager.latest()
    assert latest.server_state == {"n": 2} and (latest.weights_dir / "model.bin").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["step-3"]


def test_failures_leave_previous_checkpoint(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    manager.save(1, 1, _writer("w1"), {})
    calls: list[Path] = []

    def broken(directory: Path) -> None:
        calls.append(directory)
        (directory / "model.bin").write_text("partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        manager.save(2, 2, broken, {})
    with pytest.raises(CheckpointError, match="plain JSON"):
        manager.save(3, 3, _writer("w3"), {"bad": object()})
    with pytest.raises(CheckpointError):
        manager.save(-1, 0, _writer("x"), {})
    assert len(calls) == 1  # the non-JSON state was refused before any weights were written
    assert manager.latest().step == 1
    assert [p.name for p in tmp_path.iterdir()] == ["step-1"]


def test_incomplete_or_mislabelled_dirs_are_skipped(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    manager.save(1, 1, _writer("w1"), {})
    (tmp_path / "step-5" / "weights").mkdir(parents=True)  # no meta.json
    (tmp_path / "step-6").mkdir()
    (tmp_path / "step-6" / "meta.json").write_text("{not json")
    (tmp_path / "step-7").mkdir()
    (tmp_path / "step-7" / "meta.json").write_text(json.dumps({"step": 2, "policy_version": 2, "time": 0}))
    assert manager.latest().step == 1
    with pytest.raises(CheckpointError, match=r"meta\.json"):
        CheckpointManager.load_meta(tmp_path / "step-5")


def test_bad_keep_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError):
        CheckpointManager(tmp_path, keep=0)


_SLOW_SAVER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from swarm.server.durability.checkpoints import CheckpointManager
    manager = CheckpointManager(sys.argv[1], keep=3)
    def fast(d):
        (d / "model.bin").write_bytes(b"A" * 100_000)
    def slow(d):
        with open(d / "model.bin", "wb") as f:
            f.write(b"B" * 50_000)
            f.flush()
            print("writing", flush=True)
            time.sleep(60)
            f.write(b"B" * 50_000)
    manager.save(1, 1, fast, {"cursor": 1})
    manager.save(2, 2, slow, {"cursor": 2})
    print("done", flush=True)
""")


def test_sigkill_during_slow_write_keeps_previous_latest(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_SAVER, str(root)], stdout=subprocess.PIPE, text=True,
                            env=env)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "writing"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert any(p.name.startswith(".tmp-") for p in root.iterdir())  # the half-written step 2
    manager = CheckpointManager(root)
    latest = manager.latest()
    assert latest is not None and latest.step == 1 and latest.server_state == {"cursor": 1}
    assert (latest.weights_dir / "model.bin").read_bytes() == b"A" * 100_000
    assert [p.name for p in root.iterdir()] == ["step-1"]  # the leftover was cleaned up
    manager.save(2, 2, _writer("w2"), {"cursor": 2})
    assert manager.latest().step == 2
