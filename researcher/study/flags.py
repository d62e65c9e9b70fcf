"""The command line's values read into what a study needs: durations, deadlines, study options and
study ids. Every reader raises ``ValueError`` with a message meant for the person who typed it.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

from researcher.study.layout import check_study_id, slugify
from researcher.types.settings import StudyOptions
from swarm.models.hub import hub_snapshot, parse_hub_name
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


def run_model(model: str | None) -> str | None:
    """What every run's ``swarm serve --model`` gets for ``--model``: an existing path made absolute
    (runs start in their own folders); a Hugging Face Hub name fetched now (downloaded, or found in the
    hub cache offline) and pinned to its commit, so every run of the study loads one snapshot even if
    the Hub's branch moves; anything else as given. ``ValueError`` naming the download command for a
    Hub model neither cached nor downloadable, before the study starts."""
    if not model:
        return model
    if Path(model).exists():
        return str(Path(model).resolve())
    name = parse_hub_name(model)
    return model if name is None else str(name.pinned(hub_snapshot(name)))


def study_options(flags: dict[str, Any], servers: list[str] | None) -> StudyOptions:
    """StudyOptions from the flags given (None = not given); with servers, one run per server; with a
    pretrained ``model``, timeouts sized for it (``REAL_MODEL_TIMEOUTS``)."""
    overrides = {k: v for k, v in flags.items() if v is not None}
    if servers and "parallel_runs" not in overrides:
        overrides["parallel_runs"] = len(servers)
    if overrides.get("model") and model_facts(str(overrides["model"])).pretrained:
        overrides = {**REAL_MODEL_TIMEOUTS, **overrides}
    return StudyOptions(**overrides)


def json_object(text: str | None, flag: str) -> dict[str, Any] | None:
    """A flag's JSON object (None when not given); anything else is a ValueError naming the flag."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{flag}: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{flag}: a JSON object is expected, e.g. '{{\"lr\": 0.003}}'")
    return value


def study_id(given: str | None, topic: str, now: dt.datetime) -> str:
    """The given id, or one derived from the topic and the time."""
    return check_study_id(given or f"{slugify(topic, 32)}-{now:%m%d-%H%M%S}")
