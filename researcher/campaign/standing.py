"""Where a claim's study stands, read from its files only: its phase, the latest look's verdict (classed by
the same code as the report's Answer, then turned to answer the claim's own question), the seeds it has and
needs, its runs' MLflow ids and CPU time, and the configuration a settled finding makes the task's baseline."""

from __future__ import annotations

import time
from typing import Any

from researcher.campaign.record import LookEntry
from researcher.findings import verdicts
from researcher.findings.axes import REWARD_METRICS
from researcher.findings.records import Evidence
from researcher.operations import overview
from researcher.planner import screen, topic
from researcher.runs import record as runs
from researcher.study import files as studyfiles
from researcher.study.layout import StudyLayout
from researcher.study.state import StudyState, last_summary, study_framing, study_options, summaries
from researcher.types.design import same_value

NO_VERDICT = "no verdict yet"


def answer_class(layout: StudyLayout) -> verdicts.Verdict | None:
    """The class of the study's Answer in report.md (None before the report, or an unclassed Answer)."""
    answer = overview.report_answer(layout)
    return verdicts.answer_class(answer) if answer is not None else None


def study_verdict(state: StudyState) -> verdicts.Verdict | None:
    """The class of the Answer the study's evidence so far gives (worded as the report words it)."""
    answer, _ = verdicts.verdict(state.get("topic") or "", summaries(state))
    return verdicts.answer_class(answer)


def as_claimed(claim_topic: str, verdict: verdicts.Verdict | None, study: Evidence | None) -> verdicts.Verdict | None:
    """The study's verdict as the answer to its claim's own question.

    A study signs its difference "larger minus smaller" (a number knob) or "better minus worse" (a named
    one), while a claim asks about the value it names first, and asks for a higher metric, a lower one, the
    same or any difference (``topic.parse``'s ``asks``): "Does a KL coefficient of 0.2 slow learning…?" is
    answered Yes by the study's "No: the larger kl_coef learned slower", and "Does a group size of 2 match
    8?" No by any resolved difference. Only a resolved direction turns; the other classes answer either
    question alike.
    """
    if verdict is None or not verdicts.resolved(verdict) or study is None or study.comparison is None:
        return verdict
    asked = topic.parse(claim_topic)
    if asked.identical or not asked.values:
        return verdict
    if asked.asks in ("same", "different"):
        return verdicts.Verdict.NO if asked.asks == "same" else verdicts.Verdict.YES
    subject = next((a for a in study.arms if same_value(a.value, asked.values[0])), None)
    if subject is None:
        return verdict
    ahead = subject.name == study.comparison.better
    return verdicts.Verdict.YES if ahead == (asked.asks == "higher") else verdicts.Verdict.NO


def claim_verdict(state: StudyState, answered: verdicts.Verdict | None = None) -> verdicts.Verdict | None:
    """The verdict the claim (the study's topic) gets from the study's ``answered``, by default the one
    the study's evidence so far gives."""
    last = last_summary(state)
    found = answered if answered is not None else study_verdict(state)
    return as_claimed(state.get("topic") or "", found, last.study if last else None)


def latest_look(layout: StudyLayout, state: StudyState) -> LookEntry | None:
    """The standing after the study's last analysed look (None before its first analysis)."""
    history = summaries(state)
    if not history:
        return None
    verdict = claim_verdict(state)
    comparison = history[-1].study.comparison if history[-1].study else None
    design = studyfiles.read_plan(layout).design
    return LookEntry(look=len(history), seeds=comparison.seeds if comparison else 0,
                     verdict=verdict.value if verdict else NO_VERDICT,
                     diff=comparison.diff if comparison else None, hw=comparison.hw if comparison else None,
                     better=comparison.better_label or comparison.better if comparison else "",
                     needed_seeds=design.needed_seeds if design else None, mlflow_runs=mlflow_runs(layout))


def mlflow_runs(layout: StudyLayout) -> list[str]:
    return sorted(r.mlflow_run_id for r in runs.all_records(layout.runs_dir) if r.mlflow_run_id)


def cpu_hours(layout: StudyLayout, now: float | None = None) -> float:
    """Its runs' wall time (a running one: so far, less time parked) x their torch threads, in hours."""
    now = now or time.time()
    total = 0.0
    for r in runs.all_records(layout.runs_dir):
        wall = r.wall_s if r.wall_s is not None else max(now - r.started_at - r.parked_s, 0.0)
        total += wall * r.threads
    return total / 3600


def task(state: StudyState) -> str | None:
    """The example task the study's framing starts from (letters, digits, …)."""
    framing = study_framing(state)
    return (framing.example or None) if framing is not None else None


def winner_settings(state: StudyState) -> dict[str, Any] | None:
    """The better arm's config overrides when the study's verdict resolved a direction (Yes or No) on the
    task's reward: the finding a later claim on the task starts from. None for any other verdict, and for a
    claim judged on another metric (entropy, answer length), whose "better" arm is only the higher curve."""
    last = last_summary(state)
    study = last.study if last else None
    if study is None or study.comparison is None or study.metric not in REWARD_METRICS:
        return None
    verdict = study_verdict(state)
    if verdict is None or not verdicts.resolved(verdict):
        return None
    better = next((a for a in study.arms if a.name == study.comparison.better), None)
    return dict(better.overrides) if better is not None and better.overrides else None




def confirmations(state: StudyState) -> list[tuple[str, str]]:
    """A screen's flagged knobs as claims to confirm (topic, expected direction), from its last analysis."""
    last, framing = last_summary(state), study_framing(state)
    study = last.study if last else None
    if framing is None or study is None:
        return []
    return screen.confirmations(framing, study.effects, study_options(state).min_effect)
