"""The watchdogs a days-long study runs (``researcher.session.watchdogs``): a hung client, and a disk
almost full (the park it leads to, on a real study, is ``e2e/researcher/test_watchdogs.py``'s)."""

from __future__ import annotations

import shutil
from pathlib import Path

from researcher.session import watchdogs


def test_client_stuck_rule() -> None:
    now = 1000.0
    assert watchdogs.client_stuck(finished_now=5, finished_before=5, since=now - 700, now=now, server_waiting=True,
                                  limit_s=600)
    assert not watchdogs.client_stuck(finished_now=6, finished_before=5, since=now - 700, now=now,
                                      server_waiting=True, limit_s=600)
    assert not watchdogs.client_stuck(finished_now=5, finished_before=5, since=now - 700, now=now,
                                      server_waiting=False, limit_s=600)  # training, not waiting
    assert not watchdogs.client_stuck(finished_now=5, finished_before=5, since=now - 100, now=now,
                                      server_waiting=True, limit_s=600)


def test_disk_low_names_the_free_space_and_what_the_study_needs(tmp_path: Path) -> None:
    free_mb = shutil.disk_usage(tmp_path).free / 2**20
    reason = watchdogs.disk_low(tmp_path / "not" / "made" / "yet", free_mb * 2 + 1024)  # the nearest folder counts
    assert reason is not None and reason.startswith("disk almost full:") and f"under {tmp_path}" in reason
    assert watchdogs.disk_low(tmp_path, 1.0) is None and watchdogs.disk_low(tmp_path, 0) is None
