"""A study's preparation, before a session runs its graph: what ``researcher start`` was asked read into
the study's settings, options, id, deadline and window, the user's own data snapshotted into the study's
task, and the study's context built and checked; for ``researcher resume``, the context of a study on
disk (its data unchanged). ``researcher.session.runner`` runs what this prepares; ``researcher.cli`` only parses
the flags; a campaign refuses a claim's topic by the same check as a start (``offline_framing``).

Every refusal of a start is a ``Refused`` (the CLI's exit 2), raised before the study's own files are
written (a ``--data`` snapshot excepted: it is the study's task, written before its context is built).
Nothing here loads the graph.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from researcher.planner import catalog
from researcher.planner.designed import Design
from researcher.planner.offline import OfflinePlanner
from researcher.planner.schema import TopicNotMappable
from researcher.runs import resources
from researcher.runs.ray_launcher import RayLauncher
from researcher.session.composition import Emit, build_context, build_settings, default_dir
from researcher.session.context import StudyContext
from researcher.study import datatask, flags, store
from researcher.study import files as studyfiles
from researcher.study.flags import parse_duration
from researcher.study.layout import StudyLayout, check_study_id
from researcher.study.state import study_options
from researcher.types.design import DATA_TASK, Framing
from researcher.types.settings import ResearcherSettings, StudyOptions

DEFAULT_DATA_CONFIG = "studies/examples/arith"  # the server config a --data task starts from without --data-config


class Refused(ValueError):
    """A start refused before it began: the message is for the person who typed the command."""


@dataclass(frozen=True, kw_only=True)
class DataFlags:
    """``--data`` and the flags that go with it, as given."""

    source: str
    reward: str = "verl"
    heldout: str | None = None
    prompt_key: str = "prompt"
    answer_key: str | None = None
    warmup_steps: int = 0
    config: Path | None = None


@dataclass(frozen=True, kw_only=True)
class StartRequest:
    """What ``researcher start`` was asked, as its flags gave it; ``prepare_start`` reads and checks it."""

    topic: str
    studies_dir: Path
    artifacts_dir: Path
    budget: str | None = None
    until: str | None = None
    study_id: str | None = None
    servers: list[str] | None = None
    window: str | None = None
    # StudyOptions' flags by field name, None where not given; ``model``, ``run_resources`` and
    # ``baseline`` as typed (a name or path, JSON, JSON): read here.
    options: dict[str, Any] = field(default_factory=dict)
    data: DataFlags | None = None


@dataclass(frozen=True)
class Prepared:
    """A study ready to start: its context and what its first state is made of."""

    ctx: StudyContext
    topic: str
    options: StudyOptions
    deadline: float


def prepare_start(request: StartRequest, printer: Emit | None = None) -> Prepared:
    """The new study's context, options and deadline; ``Refused`` for anything the flags got wrong, a Ray
    cluster that cannot see our files, or a topic the offline planner cannot map."""
    try:
        deadline = flags.deadline(request.budget, request.until, time.time())
        settings = build_settings(request.studies_dir, request.artifacts_dir, request.servers)
        options = _options(request.options, request.servers)
        if options.baseline:
            studyfiles.check_overrides(options.baseline)  # unknown config keys: refused, nothing written
        if options.design is not None:
            for arm in Design.model_validate(options.design).arms:
                studyfiles.check_overrides(arm.overrides)
        sid = flags.study_id(request.study_id, request.topic, dt.datetime.now())
        window_s = parse_duration(request.window) if request.window else None
        if request.data is not None:
            options, settings = _data_task(request.data, options, settings, sid)
    except (ValueError, OSError) as exc:
        raise Refused(str(exc)) from exc
    ctx = build_context(settings, sid, options, printer=printer, window_s=window_s)
    check_cluster(ctx)
    if isinstance(ctx.planner, OfflinePlanner):  # the planner keeps this framing: the study's first node reads it
        offline_framing(ctx.planner, request.topic, settings.examples_root)
    return Prepared(ctx, request.topic, options, deadline)


def prepare_resume(study_id: str, studies_dir: Path, artifacts_dir: Path, printer: Emit | None = None,
                   window_s: float | None = None) -> StudyContext:
    """The context of a study on disk, for ``window_s`` seconds if given (then it parks). ``ValueError``
    for a bad id or a study whose data changed since it started (the same data, or no resume)."""
    settings = build_settings(studies_dir, artifacts_dir)
    check_study_id(study_id)
    layout = StudyLayout(study_id, settings.studies_root, settings.artifacts_root)
    state = store.read_state(layout) or {}
    options = study_options(state) if state.get("options") else None
    if options is not None and options.data is not None:
        datatask.check_unchanged(options)
        settings = settings.model_copy(update={"examples_root": datatask.root(layout.study_dir)})
    return build_context(settings, study_id, options, printer=printer, window_s=window_s)


def check_cluster(ctx: StudyContext) -> None:
    """A Ray study must keep its checkpoints and MLflow where every node sees them (``Refused`` if not)."""
    launcher = ctx.launcher
    if not isinstance(launcher, RayLauncher):
        return
    try:
        launcher.check_shared(ctx.settings.artifacts_root, ctx.settings.mlflow_uri())
    except ValueError as exc:  # a malformed --ray-address, or ClusterNotShared: nodes that cannot see our files
        raise Refused(str(exc)) from exc
    except (ConnectionError, RuntimeError) as exc:
        raise Refused(f"cannot reach the Ray cluster at {launcher.address}: {exc}") from exc


def offline_framing(planner: OfflinePlanner, topic: str, examples_root: Path) -> Framing:
    """How the offline planner frames ``topic`` on the examples under ``examples_root``; ``Refused`` (naming
    what it can study) when the topic maps onto none of them."""
    try:
        return planner.frame(topic, catalog.describe(examples_root)).value
    except TopicNotMappable as exc:
        raise Refused(str(exc)) from exc


def _options(given: dict[str, Any], servers: list[str] | None) -> StudyOptions:
    """The study's options from its flags: a Hub model pinned, the resources and baseline read as JSON."""
    return flags.study_options({**given, "model": flags.run_model(given.get("model")),
                                "run_resources": resources.parse_run_resources(given.get("run_resources")) or None,
                                "baseline": flags.json_object(given.get("baseline"), "--baseline"),
                                "design": flags.json_object(given.get("design"), "--design")}, servers)


def _data_task(data: DataFlags, options: StudyOptions, settings: ResearcherSettings,
               sid: str) -> tuple[StudyOptions, ResearcherSettings]:
    """``--data`` made the study's task: the rows snapshotted into the study, its config written, and the
    settings pointed at it as the study's one example."""
    layout = StudyLayout(sid, settings.studies_root, settings.artifacts_root)
    if layout.study_toml.is_file():
        raise ValueError(f"study {sid} already exists; use `researcher resume {sid}` or pick another --study-id")
    options = options.model_copy(update=datatask.options_for(
        data.source, data.heldout, data.reward, data.warmup_steps, prompt_key=data.prompt_key,
        answer_key=data.answer_key, snapshot_dir=datatask.root(layout.study_dir) / DATA_TASK))
    base = data.config or default_dir(DEFAULT_DATA_CONFIG) / "config.toml"
    task_root = datatask.write_task(options, layout.study_dir, base, scale_to_model=data.config is None)
    return options, settings.model_copy(update={"examples_root": task_root})
