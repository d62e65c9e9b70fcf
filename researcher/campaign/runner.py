"""Running a campaign: one study session at a time, each given to the open claim closest to settling.

Each claim is an ordinary study, ``<campaign>-c<k>``, started with ``--park-after-look``: after every
look that does not conclude it parks, and the campaign chooses which claim takes the next look
(``allocate``). A session is ``researcher start`` or ``researcher resume`` as a subprocess in its own
process group, with ``--window`` set to what is left of the campaign's budget (and of its daily window),
so a study parks rather than overrun. Studies keep their own registered looks and alpha spending: the
campaign decides only the order.

The budget is running time: the seconds its sessions take, booked to the claim that ran. Its
studies' wall deadline is the budget stretched over the daily windows (``study_deadline``), so a
study parked overnight is not out of time the next evening.

Crash safety: campaign.json names the session in progress before it starts. A campaign killed
(SIGKILL) mid-session is resumed by waiting for that study's lock to be free (the session, in its
own process group, runs on), then booking its time; claim studies have fixed ids, so a claim is
started once and resumed after (a study launches no run twice: ``researcher.runs``).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

from researcher.campaign import allocate, discover, figures, goal, ledger, proposals, record, standing, tracking
from researcher.campaign.record import CampaignRecord, ClaimRecord, Session, claim_study_id
from researcher.campaign.spec import CONFIRM_SEED_BASE, CampaignSpec, Claim, parse
from researcher.planner import catalog
from researcher.planner.offline import OfflinePlanner
from researcher.session.composition import build_settings
from researcher.session.preparation import Refused, offline_framing
from researcher.study.layout import StudyLayout
from researcher.study.state import StudyState
from researcher.study.store import is_locked, read_state, study_lock
from researcher.types.settings import ResearcherSettings
from swarm import stopping
from swarm.atomic import write_atomic

log = logging.getLogger(__name__)
SESSION_GRACE_S = 600.0  # a session may overrun its window by this much (finishing a node) before it is ended
MIN_SESSION_S = 30.0     # less running time than this left: the campaign ends rather than start a session
Say = Callable[[str], None]


def _task_of(claim: Claim, examples_root: Path, offline: OfflinePlanner | None) -> str | None:
    """The example task the offline planner frames the claim on (a refused topic is a ValueError);
    None with an LLM planner (it frames the claim when the study starts) or for a claim on its own data."""
    if claim.data:
        return f"data:{claim.data}"
    if offline is None:
        return None
    try:  # the check a start makes: a claim the offline planner cannot map is refused here, not later
        return offline_framing(offline, claim.topic, examples_root).example
    except Refused as exc:
        raise ValueError(f"claim {claim.topic!r}: {exc}") from None


def create(spec: CampaignSpec, text: str, budget_s: float, window: tuple[str, float] | None,
           studies_root: Path, artifacts_root: Path) -> CampaignRecord:
    """Write a new campaign's folder (campaign.toml as given, campaign.json, ledger.md); every claim is
    checked first, so a refused one writes nothing."""
    name = spec.campaign.name
    if record.is_campaign(studies_root, name) or (studies_root / name).exists():
        raise ValueError(f"{studies_root / name} exists already: `researcher campaign resume {name}`, or rename "
                         "the campaign")
    settings = build_settings(studies_root, artifacts_root)
    spec = spec.expanded([])
    found_goal = goal.read(spec.campaign.goal, sorted(catalog.examples(settings.examples_root))) \
        if spec.campaign.goal else None
    offline = OfflinePlanner(sorted(catalog.examples(settings.examples_root))) if settings.llm is None else None
    tasks = [_task_of(claim, settings.examples_root, offline) for claim in spec.claim]
    for index in range(len(spec.claim)):
        if StudyLayout(claim_study_id(name, index), studies_root, artifacts_root).study_dir.exists():
            raise ValueError(f"a study {claim_study_id(name, index)} exists already; rename the campaign")
    # The claims' wall deadline: the running budget, stretched by the share of a day its window opens.
    day_share = window[1] / 86_400 if window else 1.0
    rec = CampaignRecord(name=name, budget_s=budget_s, window=window[0] if window else None,
                         study_deadline=time.time() + budget_s / day_share + (86_400 if window else 0),
                         claims=[ClaimRecord(index=i, study_id=claim_study_id(name, i), task=tasks[i])
                                 for i in range(len(spec.claim))])
    if found_goal is not None:
        rec.goal = found_goal
        rec.discovery = discover.start(found_goal, settings.examples_root, spec.campaign.min_effect or 0.02)
    folder = record.folder(studies_root, name)
    folder.mkdir(parents=True)
    write_atomic(folder / record.SPEC_FILE, text)
    record.save(studies_root, rec)
    write_atomic(folder / record.LEDGER_FILE, ledger.render(spec, rec))
    return rec


def load(studies_root: Path, name: str) -> tuple[CampaignSpec, CampaignRecord]:
    rec = record.load(studies_root, name)
    if rec is None:
        raise ValueError(f"no campaign {name!r} under {studies_root}")
    folder = record.folder(studies_root, name)
    return parse((folder / record.SPEC_FILE).read_text(), str(folder / record.SPEC_FILE)).expanded(rec.added), rec


def _session_argv(spec: CampaignSpec, rec: CampaignRecord, claim: ClaimRecord, window_s: float,
                  studies_root: Path, artifacts_root: Path) -> list[str]:
    roots = ["--studies-dir", str(studies_root), "--artifacts-dir", str(artifacts_root)]
    layout = StudyLayout(claim.study_id, studies_root, artifacts_root)
    if layout.graph_db.is_file() or layout.study_toml.is_file():
        return [sys.executable, "-m", "researcher.cli", "resume", claim.study_id, "--window", f"{window_s:.0f}s", *roots]
    c = spec.claim[claim.index]
    until = dt.datetime.fromtimestamp(rec.study_deadline).astimezone().isoformat(timespec="seconds")
    argv = [sys.executable, "-m", "researcher.cli", "start", "--topic", c.topic, "--study-id", claim.study_id,
            "--until", until, "--window", f"{window_s:.0f}s", "--park-after-look", *roots]
    for key, value in spec.knobs(claim.index).items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    for key in ("model", "data", "heldout", "reward", "prompt_key", "answer_key", "data_config"):
        if getattr(c, key) is not None:
            argv += [f"--{key.replace('_', '-')}", str(getattr(c, key))]
    if claim.baseline:
        argv += ["--baseline", json.dumps(claim.baseline)]
    if c.design is not None:
        argv += ["--design", json.dumps(c.design)]
    if c.alpha is not None:
        argv += ["--alpha", f"{c.alpha:.6g}"]
    return argv


def _run_session(argv: list[str], window_s: float, log_path: Path, cwd: str) -> int | None:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        out.write(f"\n=== {dt.datetime.now().isoformat(timespec='seconds')} {' '.join(argv[3:5])} ===\n".encode())
        out.flush()
        proc = stopping.start_child(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd)
        try:
            proc.wait(timeout=window_s + SESSION_GRACE_S)
        except subprocess.TimeoutExpired:
            log.warning("session %s overran its window; ending it", argv[3:5])
        finally:
            code = stopping.stop_child(proc, grace_s=30.0)
    return code


def _refresh(spec: CampaignSpec, rec: CampaignRecord, claim: ClaimRecord, studies_root: Path,
             artifacts_root: Path) -> None:
    """Read the claim's study back after a session: its phase, a new look's standing, its Answer once
    ended, its CPU time; a settled direction becomes its task's baseline, and an ended screen adds its
    confirmations (a screen's own winner is a selection, never a baseline)."""
    layout = StudyLayout(claim.study_id, studies_root, artifacts_root)
    state = read_state(layout) or {}
    if not state:
        return
    claim.phase = state.get("phase", claim.phase)
    claim.cpu_hours = standing.cpu_hours(layout)
    claim.task = claim.task or standing.task(state)
    if spec.claim[claim.index].expect == "screen":
        if claim.closed and not rec.screened:
            _add_confirmations(spec, rec, claim, state)
        return
    look = standing.latest_look(layout, state)
    if look is not None and (not claim.looks or look.look > claim.looks[-1].look):
        claim.looks.append(look)
    if claim.stage is not None:  # a goal's stage: what it found goes to the search, not to a verdict
        if claim.closed:
            discover.record_outcome(rec, claim, state)
        return
    if claim.closed:
        answered = standing.answer_class(layout)
        claimed = standing.claim_verdict(state, answered) if answered is not None else None
        claim.study_verdict = answered.value if answered else None
        claim.verdict = claimed.value if claimed else None
        winner = standing.winner_settings(state) if claim.phase == "done" else None
        if winner and claim.task and claim.study_id not in rec.baseline_sources.get(claim.task, []):
            rec.baselines[claim.task] = {**rec.baselines.get(claim.task, {}), **winner}
            rec.baseline_sources.setdefault(claim.task, []).append(claim.study_id)


def _add_confirmations(spec: CampaignSpec, rec: CampaignRecord, claim: ClaimRecord, state: StudyState) -> None:
    """An ended screen: each knob it flags as a claim of the campaign's, on seeds the screen never used
    (added once: campaign.json says so)."""
    found = standing.confirmations(state) if claim.phase == "done" else []
    claim.verdict = f"flagged {len(found)} knob(s)" if claim.phase == "done" else None
    for topic, expect in found:
        added = Claim(topic=topic, expect=expect, source=f"flagged by the screen {claim.study_id}",
                      seed_base=CONFIRM_SEED_BASE)
        rec.added.append(added.model_dump(exclude_none=True))
        spec.claim.append(added)
        index = len(rec.claims)
        rec.claims.append(ClaimRecord(index=index, study_id=claim_study_id(rec.name, index), task=claim.task))
    rec.screened = True


def _write(spec: CampaignSpec, rec: CampaignRecord, studies_root: Path, tracking_uri: str | None) -> None:
    record.save(studies_root, rec)
    folder = record.folder(studies_root, rec.name)
    figures.write(rec, folder / "figures")
    write_atomic(folder / record.LEDGER_FILE, ledger.render(spec, rec))
    if tracking_uri:
        tracking.log_campaign(tracking_uri, spec, rec)


def _finish_pending(spec: CampaignSpec, rec: CampaignRecord, studies_root: Path, artifacts_root: Path,
                    say: Say) -> None:
    """A session a killed campaign left: wait while its study still runs, then book its time."""
    session = rec.session
    if session is None:
        return
    claim = rec.claims[session.claim]
    layout = StudyLayout(claim.study_id, studies_root, artifacts_root)
    if is_locked(layout):
        say(f"waiting for the session of {claim.study_id} a killed campaign left running")
        while is_locked(layout):
            time.sleep(2.0)
    claim.spent_s += max(time.time() - session.started, 0.0)
    claim.sessions += 1
    rec.session = None
    _refresh(spec, rec, claim, studies_root, artifacts_root)


def run(name: str, studies_root: Path, artifacts_root: Path, window_s: float | None = None,
        say: Say = log.info) -> CampaignRecord:
    """Run the campaign until its budget is spent, every claim is closed, or ``window_s`` passes (it then
    parks: ``resume`` or the daemon continues it). Holds the campaign's lock throughout."""
    studies_root, artifacts_root = studies_root.resolve(), artifacts_root.resolve()
    settings = build_settings(studies_root, artifacts_root)
    uri = settings.mlflow_uri()
    window_end = time.time() + window_s if window_s else None
    with study_lock(record.layout(studies_root, artifacts_root, name)):
        spec, rec = load(studies_root, name)
        if rec.ended:
            say(f"campaign {name} ended: {rec.ended}")
            return rec
        _finish_pending(spec, rec, studies_root, artifacts_root, say)
        _write(spec, rec, studies_root, uri)
        proposer = _proposer(settings, rec)
        while True:
            # A goal's next stage, sized to the budget (each round's screen with an LLM's hypotheses, if any).
            discover.advance(spec, rec, studies_root, artifacts_root, proposer)
            shares = [c.share for c in spec.claim]  # a screen adds claims as it ends
            left = rec.left_s if window_end is None else min(rec.left_s, window_end - time.time())
            claim = allocate.next_claim(rec.claims, shares, rec.budget_s)
            if claim is None and not rec.ended:
                rec.ended = "every claim is settled, at its last look, or out of its share"
            elif rec.left_s < MIN_SESSION_S:
                rec.ended = f"the budget is spent ({rec.spent_s / 3600:.2f} h of running time)"
            if rec.ended or left < MIN_SESSION_S:
                _write(spec, rec, studies_root, uri)
                say(f"campaign {name} " + (f"ended: {rec.ended}" if rec.ended else "parked: its window ended"))
                return rec
            assert claim is not None
            if not claim.looks and claim.task and claim.task in rec.baselines and claim.baseline is None:
                claim.baseline, claim.baseline_from = dict(rec.baselines[claim.task]), list(rec.baseline_sources[claim.task])
            rec.session = Session(claim=claim.index, started=time.time())
            _write(spec, rec, studies_root, uri)
            argv = _session_argv(spec, rec, claim, left, studies_root, artifacts_root)
            say(f"c{claim.index + 1} ({claim.study_id}): {argv[3]} for up to {left / 60:.0f} min — "
                f"{spec.claim[claim.index].topic}")
            before = (claim.phase, len(claim.looks))
            code = _run_session(argv, left, artifacts_root / name / "sessions.log", rec.cwd)
            claim.spent_s += time.time() - rec.session.started
            claim.sessions += 1
            rec.session = None
            _refresh(spec, rec, claim, studies_root, artifacts_root)
            if code == 2 and claim.phase == "not started":
                claim.phase, claim.note = "failed", "its study was refused at start (exit 2; see sessions.log)"
            latest = claim.looks[-1].verdict if claim.looks else "no look yet"
            say(f"c{claim.index + 1}: {claim.phase}, {claim.verdict or latest} "
                f"({claim.spent_s / 60:.1f} min, {claim.cpu_hours:.2f} CPU-h)")
            _write(spec, rec, studies_root, uri)
            if (claim.phase, len(claim.looks)) == before and not claim.closed and code != 0:
                # No look and no change (a full disk, a crash before its first node): park the campaign
                # rather than spin; the next session (resume, the daemon) tries again.
                say(f"campaign {name} parked: the session of {claim.study_id} made no progress (exit {code}; "
                    f"see {artifacts_root / name / 'sessions.log'})")
                return rec


def _proposer(settings: ResearcherSettings, rec: CampaignRecord) -> proposals.Proposer | None:
    """A goal campaign's LLM proposer where an LLM is configured (its task's config is what proposals start from)."""
    if rec.goal is None or rec.discovery is None or settings.llm is None:
        return None
    example = catalog.examples(settings.examples_root).get(rec.goal.task)
    task_config = tomllib.loads(example.config.read_text()) if example else {}
    return proposals.llm_proposer(settings, rec.goal, task_config)
