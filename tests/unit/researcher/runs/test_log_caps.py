"""Size caps for a study of days: a run log that a live process appends to stays under its cap
(copy-truncate, the writer keeps writing), and events.jsonl rotates while its ids go on and a
follower misses no event across a rotation."""

from __future__ import annotations

import sys
from pathlib import Path

from researcher.runs import detached
from researcher.runs.logs import cap
from researcher.study.events import EventLog, Follower


def test_cap_truncates_a_log_a_live_process_appends_to(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    writer = ("import sys, time\n"
              "for i in range(400):\n"
              "    print(f'line {i:04d} ' + 'x' * 40, flush=True)\n"
              "    time.sleep(0.002)\n")
    pid, started = detached.spawn([sys.executable, "-c", writer], log_path=log)
    cut_total = 0
    try:
        while detached.alive(pid, started):
            cut_total += cap(log, max_bytes=2000, keep=2)
    finally:
        detached.stop_group(pid, started, grace_s=3.0)
    cap(log, max_bytes=2000, keep=2)
    assert log.stat().st_size <= 2000
    assert cut_total > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["server.log", "server.log.1", "server.log.2"]
    tail = log.read_text() or (tmp_path / "server.log.1").read_text()
    assert "line 0399" in tail and "\0" not in tail  # the writer went on at the start (O_APPEND): no hole


def test_events_rotate_ids_go_on_and_a_follower_sees_every_one(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    events = EventLog(path, max_bytes=600, keep=2)
    follower = Follower(path)
    seen: list[int] = []
    for n in range(60):
        events.append("progress", step=n, note="y" * 20)
        if n % 3 == 0:
            seen += [e["id"] for e in follower.poll()]
    seen += [e["id"] for e in follower.poll()]
    assert seen == list(range(1, 61))
    files = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock"))
    assert files == ["events.jsonl", "events.jsonl.1", "events.jsonl.2"]
    assert all((tmp_path / name).stat().st_size < 600 + 200 for name in files)
    assert EventLog(path, max_bytes=600, keep=2).append("progress")["id"] == 61


def test_a_rotation_right_after_a_write_keeps_ids(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    events = EventLog(path, max_bytes=1, keep=1)  # every append rotates the file before it first
    ids = [events.append("progress")["id"] for _ in range(3)]
    assert ids == [1, 2, 3]
    assert path.read_text().count("\n") == 1
