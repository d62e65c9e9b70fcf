"""When a scheduled study resumes (``researcher.operations.scheduler.ScheduleSpec``), in process: bad input is
refused before anything is written, the spec survives its file, and a changed spec has a new key (the
job store and the daemon are ``e2e/researcher/test_scheduler.py``'s)."""

from __future__ import annotations

import datetime as dt

import pytest

from researcher.operations import scheduler
from researcher.operations.scheduler import ScheduleSpec


def test_spec_validation_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="--at"):
        ScheduleSpec(window_s=60, at="25:00")
    with pytest.raises(ValueError, match="invalid --cron"):
        ScheduleSpec(window_s=60, cron="0 22 * *")
    with pytest.raises(ValueError, match="not both"):
        ScheduleSpec(window_s=60, cron="0 22 * * *", at="22:00")
    with pytest.raises(ValueError, match="give --at"):
        ScheduleSpec(window_s=60)
    spec = ScheduleSpec(window_s=8 * 3600, cron="0 22 * * *")
    assert ScheduleSpec.from_toml(spec.to_toml()) == spec
    now = dt.datetime(2026, 11, 22, 23, 0, tzinfo=dt.UTC)
    assert scheduler.next_clock_time("22:00", now) == dt.datetime(2026, 11, 23, 22, 0, tzinfo=dt.UTC)


def test_a_one_shot_is_a_date_time_without_every_and_a_past_one_is_refused() -> None:
    once = ScheduleSpec(window_s=60, at="2026-12-01T02:00+00:00")
    assert once.once == dt.datetime(2026, 12, 1, 2, 0, tzinfo=dt.UTC)
    with pytest.raises(ValueError, match="is in the past"):
        once.check_future(dt.datetime(2026, 12, 2, tzinfo=dt.UTC))
    once.check_future(dt.datetime(2026, 11, 30, tzinfo=dt.UTC))
    daily, hourly = ScheduleSpec(window_s=60, at="22:00"), ScheduleSpec(window_s=60, at="22:00", every_s=3600)
    assert daily.once is None and hourly.once is None
    assert len({daily.key, hourly.key, ScheduleSpec(window_s=120, at="22:00").key}) == 3  # each change: a new job
    assert ScheduleSpec.from_toml(hourly.to_toml()) == hourly
