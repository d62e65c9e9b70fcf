"""A full disk, part by part: which errors say "full", when the monitor calls the disk full, the buffer
after a commit the disk refused, a step commit kept until space is back, and a checkpoint that cannot
be written. The real ones on a real small tmpfs; the monitor's rules with its free-space seam."""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

import pytest
from support.disks import fill, small_disk

from swarm.server.durability.checkpoints import CheckpointManager
from swarm.server.durability.diskspace import DiskMonitor, is_disk_full
from swarm.server.durability.store import EpisodeStore, FinishedEpisode
from swarm.server.records.finished import Outcome
from swarm.server.records.timeline import EpisodeTrace
from swarm.server.training.ledger import StepCommit, StepCommits

MiB = 2**20


class _Reports:
    """Where the step commits report a refused commit (the server's ``ErrorLog``)."""

    def __init__(self) -> None:
        self.where: list[str] = []

    def report(self, where: str, exc: BaseException) -> None:
        self.where.append(where)


def _episode(i: int, tokens: int = 50) -> FinishedEpisode:
    trace = EpisodeTrace()
    trace.record([1, 2, 3], [(list(range(10, 10 + tokens)), [-0.5] * tokens)], version=0, temperature=1.0)
    return FinishedEpisode.from_trace(trace, episode_id=f"ep-{i}", task_id=f"t{i}", group_id=f"t{i}", group_size=1,
                                      category=None, client_id="c", outcome=Outcome(reward=1.0))


def test_the_errors_of_a_full_disk_are_recognised_and_others_are_not() -> None:
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert is_disk_full(sqlite3.OperationalError("database or disk is full"))
    wrapped = RuntimeError("checkpoint failed")
    wrapped.__cause__ = OSError(errno.ENOSPC, "No space left on device")
    assert is_disk_full(wrapped)  # through the cause chain
    assert is_disk_full(ValueError("Error while serializing: I/O error: No space left on device (os error 28)"))
    assert not is_disk_full(OSError(errno.EFBIG, "File too large"))  # ulimit -f: not a full disk
    assert not is_disk_full(sqlite3.OperationalError("database is locked"))
    assert not is_disk_full(None)


def test_the_monitor_refuses_below_the_reserve_and_after_a_failure_until_space_comes_back() -> None:
    now, free = [0.0], [100 * MiB]
    disk = DiskMonitor("/state", reserve_bytes=10 * MiB, ttl_s=1.0, forget_s=30.0, clock=lambda: now[0],
                       free_bytes=lambda _: free[0])
    assert disk.check().model_dump() == {"full": False, "free_bytes": 100 * MiB, "reserve_bytes": 10 * MiB,
                                         "reason": ""}
    free[0] = 5 * MiB
    assert not disk.full  # measured at most once a ttl_s: the cached reading stands
    now[0] = 1.0
    status = disk.check()
    assert status.full and status.free_bytes == 5 * MiB and "below the reserve" in status.reason

    free[0] = 50 * MiB  # room again, then a write fails anyway (a burst took it)
    now[0] = 2.0
    assert not disk.full
    disk.failed("committing a finished episode", OSError(errno.ENOSPC, "No space left on device"))
    now[0] = 3.0
    status = disk.check()
    assert status.full and status.reason.startswith("committing a finished episode failed")
    free[0] = 55 * MiB  # less than the reserve more than at the failure: still full
    now[0] = 4.0
    assert disk.full
    free[0] = 61 * MiB
    now[0] = 5.0
    assert not disk.full  # enough came free

    disk.failed("recording an event", OSError(errno.ENOSPC, "x"))
    disk.succeeded()  # a later write went through
    assert not disk.full
    disk.failed("recording an event", OSError(errno.EDQUOT, "quota"))  # free space does not show a quota
    now[0] = 20.0
    assert disk.full
    now[0] = 36.0
    assert not disk.full  # forgotten after forget_s: the next write probes again


def test_a_refused_commit_rolls_back_and_the_buffer_takes_writes_again_once_space_is_back(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", 4) as disk:
        store = EpisodeStore(disk / "buffer.db")
        try:
            assert store.save_finished(_episode(0))
            filler = fill(disk)
            with pytest.raises(sqlite3.OperationalError) as refused:
                store.save_finished(_episode(1, tokens=20_000))
            assert is_disk_full(refused.value)  # the error that says why, not "no transaction is active"
            assert store.get("ep-1") is None  # rolled back whole

            monitor = DiskMonitor(disk, reserve_bytes=0, ttl_s=0.0)
            reported = _Reports()
            commits = StepCommits(store, monitor, reported)
            record = StepCommit(1, ["ep-0"], '{"step": 1}', meta={"max_policy_version": 1})
            assert not commits.commit(record)  # kept, not given up
            assert not commits.flush()  # still full: it waits (the first refusal is reported, a retry not)
            assert reported.where == ["commit"] and commits.pending == 1 and monitor.full
            with pytest.raises(OSError) as no_checkpoint:
                commits.require_written()
            assert no_checkpoint.value.errno == errno.ENOSPC

            filler.unlink()
            assert commits.flush() and commits.pending == 0
            assert store.trained_counts() == {"ep-0": 1} and store.step_metrics() == ['{"step": 1}']
            assert store.save_finished(_episode(1, tokens=20_000))  # the same connection, no restart
            assert store.get("ep-1") is not None
        finally:
            store.close()


def test_a_checkpoint_the_disk_cannot_hold_leaves_the_previous_one_whole(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", 4) as disk:
        manager = CheckpointManager(disk / "checkpoints")
        manager.save(1, 1, lambda d: (d / "model.bin").write_bytes(b"w1" * 1000), {"cursor": 1})
        before = (disk / "checkpoints" / "step-1" / "weights" / "model.bin").read_bytes()
        filler = fill(disk)
        with pytest.raises(OSError) as failed:
            manager.save(2, 2, lambda d: (d / "model.bin").write_bytes(b"w2" * MiB), {"cursor": 2})
        assert is_disk_full(failed.value)
        assert sorted(p.name for p in (disk / "checkpoints").iterdir()) == ["step-1"]  # no partial directory
        latest = manager.latest()
        assert latest is not None and latest.step == 1 and latest.server_state == {"cursor": 1}
        assert (latest.weights_dir / "model.bin").read_bytes() == before
        filler.unlink()
        assert manager.save(2, 2, lambda d: (d / "model.bin").write_bytes(b"w2" * 1000), {"cursor": 2}).name == "step-2"


def test_server_json_waits_for_room_on_a_full_disk_and_is_never_half_written(tmp_path: Path) -> None:
    """``swarm serve`` announces itself in server.json once its engines are up; a full disk then (vLLM
    can take minutes to start) made it exit. Now it waits, writes the file whole once space returns,
    and gives up quietly when the server is stopped first."""
    import asyncio
    import json

    from swarm.server.serve import announce

    info = {"url": "http://127.0.0.1:1", "pid": 1, "model": "tiny", "started": 0.0}
    with small_disk(tmp_path / "disk", 4) as disk:
        filler = fill(disk)
        path = disk / "server.json"

        async def free_later() -> bool:
            writing = asyncio.create_task(announce(path, info, lambda: False))
            await asyncio.sleep(2.5)
            assert not writing.done() and not path.exists() and not list(disk.glob(".server.json*"))
            filler.unlink()
            return await asyncio.wait_for(writing, 10)

        assert asyncio.run(free_later()) is True
        assert json.loads(path.read_text()) == info
        path.unlink()
        filler = fill(disk)
        stop = {"now": False}

        async def stopped_first() -> bool:
            writing = asyncio.create_task(announce(path, info, lambda: stop["now"]))
            await asyncio.sleep(1.5)
            stop["now"] = True
            return await asyncio.wait_for(writing, 5)

        assert asyncio.run(stopped_first()) is False and not path.exists()
