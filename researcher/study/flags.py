"""The command line's values read into what a study needs: durations, deadlines, study options and
study ids. Every reader raises ``ValueError`` with a message meant for the person who typed it.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from researcher.settings import StudyOptions
from researcher.study.layout import check_study_id, slugify
from swarm.models.named import model_facts

# A pretrained model's runs are minutes where the tiny presets' are seconds: on 2 CPU cores SmolLM2-135M's
# smoke run of 8 episodes took over 60 s (the study failed its validation four times) and a training step
# takes 1-3 minutes under load. The tiny-sized timeouts would call healthy real-model runs broken or stalled.
REAL_MODEL_TIMEOUTS = {"smoke_timeout_s": 600.0, "stall_timeout_s": 900.0}


def parse_duration(text: str) -> float:
    """'10m', '90s', '2h', '1h30m' -> seconds."""
    parts = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s)?\s*", text)
    if not text.strip() or parts is None or not any(parts.groups()):
        raise ValueError(f"cannot read duration {text!r}; use e.g. 10m, 90s, 2h or 1h30m")
    h, m, s = (float(g) if g else 0.0 for g in parts.groups())
    seconds = h * 3600 + m * 60 + s
    if seconds <= 0:
        raise ValueError("the budget must be positive")
    return seconds


def parse_until(text: str, now: float) -> float:
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"cannot read --until {text!r}; use ISO 8601, e.g. 2026-11-22T22:00") from None
    if when.tzinfo is None:
        when = when.astimezone()
    if when.timestamp() <= now:
        raise ValueError(f"--until {text} is in the past")
    return when.timestamp()


def deadline(budget: str | None, until: str | None, now: float) -> float:
    """The study's absolute deadline from ``--budget`` or ``--until`` (default: 20 minutes)."""
    if budget and until:
        raise ValueError("give --budget or --until, not both")
    return parse_until(until, now) if until else now + parse_duration(budget or "20m")


def study_options(flags: dict[str, Any], servers: list[str] | None) -> StudyOptions:
    """StudyOptions from the flags given (None = not given); with servers, one run per server; with a
    pretrained ``model``, timeouts sized for it (``REAL_MODEL_TIMEOUTS``)."""
    overrides = {k: v for k, v in flags.items() if v is not None}
    if servers and "parallel_runs" not in overrides:
        overrides["parallel_runs"] = len(servers)
    if overrides.get("model") and model_facts(str(overrides["model"])).pretrained:
        overrides = {**REAL_MODEL_TIMEOUTS, **overrides}
    return StudyOptions(**overrides)


def study_id(given: str | None, topic: str, now: dt.datetime) -> str:
    """The given id, or one derived from the topic and the time."""
    return check_study_id(given or f"{slugify(topic, 32)}-{now:%m%d-%H%M%S}")
