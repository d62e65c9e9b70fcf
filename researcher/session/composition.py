"""The researcher's one composition root: ``build_settings`` is the one place that builds
``ResearcherSettings`` (from the flags the CLI and the campaign runner pass, and the environment), and
``build_context`` wires a study's collaborators (planner, tracker, launcher, event log) into its
``StudyContext``. A study's preparation (``researcher.session.preparation``) calls them; nothing else
builds settings, chooses the planner or the placement.

Environment: RESEARCHER_LLM_BASE_URL, RESEARCHER_LLM_MODEL, OPENAI_API_KEY (the LLM planner, with the
offline planner taking any step it fails: ``researcher.planner.fallback``; without them the offline
planner runs), RESEARCHER_LLM_PRICE_IN / _OUT (USD per million tokens, for cost
accounting), MLFLOW_TRACKING_URI (default: sqlite:///<artifacts>/mlflow.db),
SWARM_TOKEN (control token of existing servers given with --server); CUDA_VISIBLE_DEVICES /
nvidia-smi (the GPUs local runs share out).
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from researcher.planner import catalog
from researcher.planner.deadline import LLMDeadline
from researcher.planner.designed import Design, DesignedPlanner
from researcher.planner.offline import OfflinePlanner
from researcher.planner.prompts import PromptLibrary
from researcher.planner.schema import Planner
from researcher.runs import resources
from researcher.runs.launcher import Launcher
from researcher.session.context import StudyContext
from researcher.study import datatask, events
from researcher.study import files as studyfiles
from researcher.study.layout import StudyLayout
from researcher.tracking.tracker import Tracker
from researcher.types.settings import LLMSettings, ResearcherSettings, StudyOptions
from researcher.types.usage import LLMCall
from swarm.atomic import write_atomic

if TYPE_CHECKING:  # the LLM planner's modules import the openai SDK: only a study with an LLM loads them
    from researcher.planner.fallback import Takeover

Emit = Callable[[str, Mapping[str, object]], None]
_REPO = Path(__file__).resolve().parents[2]  # researcher/session/composition.py -> the checkout


def default_dir(relative: str) -> Path:
    """cwd-relative when present (a checkout), else the installed repository's copy."""
    here = Path(relative)
    return here if here.is_dir() else _REPO / relative


def build_settings(studies_dir: Path, artifacts_dir: Path, servers: list[str] | None = None,
                   env: dict[str, str] | None = None) -> ResearcherSettings:
    """Settings from flags and the environment (``env``, default ``os.environ``): the one place that builds
    ``ResearcherSettings`` and reads the variables above (the GPUs excepted: ``researcher.runs.resources``)."""
    env = dict(os.environ) if env is None else env
    llm = None
    if env.get("RESEARCHER_LLM_BASE_URL") or env.get("RESEARCHER_LLM_MODEL"):
        if not (env.get("RESEARCHER_LLM_BASE_URL") and env.get("RESEARCHER_LLM_MODEL")):
            raise ValueError("set both RESEARCHER_LLM_BASE_URL and RESEARCHER_LLM_MODEL (or neither for the "
                             "offline planner)")
        llm = LLMSettings(base_url=env["RESEARCHER_LLM_BASE_URL"], model=env["RESEARCHER_LLM_MODEL"],
                          api_key=env.get("OPENAI_API_KEY") or "not-needed",
                          price_in_per_mtok=float(env.get("RESEARCHER_LLM_PRICE_IN") or 0),
                          price_out_per_mtok=float(env.get("RESEARCHER_LLM_PRICE_OUT") or 0))
    for url in servers or []:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--server must be an http(s) URL, got {url!r}")
    return ResearcherSettings(studies_root=studies_dir, artifacts_root=artifacts_dir,
                              examples_root=default_dir("studies/examples"), prompts_root=default_dir("prompts"),
                              tracking_uri=env.get("MLFLOW_TRACKING_URI") or None, servers=servers or [],
                              server_token=env.get("SWARM_TOKEN") or None, llm=llm).resolved()


def build_context(settings: ResearcherSettings, study_id: str, options: StudyOptions | None = None,
                  printer: Emit | None = None, window_s: float | None = None) -> StudyContext:
    """The study's collaborators: its planner (the LLM one, the offline one behind it, when settings name
    an LLM), tracker and launcher; every event goes to the study's event log, then to ``printer`` (the terminal) if given."""
    layout = StudyLayout(study_id, settings.studies_root, settings.artifacts_root)
    emit = events.recorder(layout, printer, max_bytes=int(settings.events_max_mb * 2**20), keep=settings.log_keep)
    deadline = LLMDeadline()
    offline = OfflinePlanner(sorted(catalog.examples(settings.examples_root)))
    planner: Planner = offline
    if settings.llm is not None:  # the offline planner stands in for any step the LLM fails
        planner = _llm_planner(settings.llm, settings.prompts_root, layout, deadline, offline,
                               _takeover_recorder(layout, emit))
    options = options or StudyOptions()
    if options.design is not None:  # a campaign's stage: its arms are given, the rest is the planner's
        planner = DesignedPlanner(Design.model_validate(options.design), planner)
    threads = max(1, (os.cpu_count() or 2) // options.parallel_runs)
    launcher = _launcher(settings, options, threads)
    tracker = Tracker(settings.mlflow_uri(), settings.mlflow_artifact_root(), layout.artifacts_dir / "mlflow_spool")
    ctx = StudyContext(settings=settings, layout=layout, planner=planner, tracker=tracker, launcher=launcher,
                       emit=emit, window_end=None if window_s is None else time.time() + window_s,
                       min_free_disk_mb=options.min_free_disk_mb, llm_deadline=deadline)
    add_listener = getattr(planner, "add_listener", None)
    if add_listener is not None:  # the LLM planner: a short event per call for `researcher watch`
        add_listener(events.llm_call_listener(ctx.say))
    return ctx


def _launcher(settings: ResearcherSettings, options: StudyOptions, threads: int) -> Launcher:
    """The study's placement: Ray when it names a cluster, else local processes sharing this machine's GPUs."""
    if options.ray_address and not settings.servers:
        from researcher.runs.ray_launcher import RayLauncher

        return RayLauncher(options.ray_address, settings.swarm_command, model=options.model, threads=threads,
                           mlflow_uri=settings.mlflow_uri(), artifacts_root=settings.artifacts_root,
                           box_read=datatask.readable(options), keep_training_state=options.keep_training_state)
    return Launcher(settings.swarm_command, model=options.model, threads=threads,
                    external_token=settings.server_token, mlflow_uri=settings.mlflow_uri(),
                    gpus=resources.discover_gpus(), artifacts_root=settings.artifacts_root,
                    log_max_bytes=int(settings.log_max_mb * 2**20), log_keep=settings.log_keep,
                    box_read=datatask.readable(options), keep_training_state=options.keep_training_state)


def _takeover_recorder(layout: StudyLayout, emit: Emit) -> Callable[[Takeover], None]:
    """Each step the offline planner takes over: a LOG.md line and a ``takeover`` event (the report lists them)."""

    def record(takeover: Takeover) -> None:
        studyfiles.log(layout, f"The offline planner took over {takeover.step} from the LLM planner: {takeover.reason}")
        emit("takeover", {"step": takeover.step, "by": "offline", "reason": takeover.reason[:500]})

    return record


def _llm_planner(llm: LLMSettings, prompts_root: Path, layout: StudyLayout, deadline: LLMDeadline,
                 offline: OfflinePlanner, on_takeover: Callable[[Takeover], None]) -> Planner:
    """The LLM planner (each call's record written to ``llm_calls/``) with ``offline`` behind it."""
    from researcher.planner.fallback import FallbackPlanner
    from researcher.planner.llm import LLMPlanner

    counter = itertools.count(1)

    def trace(record: LLMCall) -> None:
        layout.llm_calls_dir.mkdir(parents=True, exist_ok=True)
        name = f"{int(time.time() * 1000)}-{next(counter):03d}-{record['step'].replace(':', '_')}.json"
        write_atomic(layout.llm_calls_dir / name, json.dumps(record, indent=2, default=str))

    planner = LLMPlanner(llm, PromptLibrary(prompts_root), on_call=trace, deadline=deadline,
                         structured=not _fell_back_to_json(layout.llm_calls_dir))
    return FallbackPlanner(planner, offline, on_takeover)


def _fell_back_to_json(calls_dir: Path) -> bool:
    """Whether an earlier session of the study asked its LLM with the schema in the prompt (a ``json`` call
    record): its endpoint refused or ignored structured outputs, and a resumed session need not ask again."""
    for path in sorted(calls_dir.glob("*.json")):
        try:
            if json.loads(path.read_text()).get("mode") == "json":
                return True
        except (OSError, ValueError):
            continue  # a record torn by a kill says nothing
    return False
