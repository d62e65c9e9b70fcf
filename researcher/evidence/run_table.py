"""The study review: one comparison table of every training run and one figure of the verdict's curves.

Table columns: iteration, hypothesis, experiment, config (the overrides it tests), seed, status,
steps, final and best reward, AUC per training step, per episode and per wall-clock second (of the
metric the verdict used), wall time, cost (core-seconds: wall time x torch threads) and a verdict:
``keep`` (a run of the study's best configuration, pooled over iterations), ``discard`` (usable but not
best) or ``crashed`` (no usable curve: crashed, stalled, diverged, stopped).

The numbers are the report's: each run's AUCs and final reward come from ``analysis.evidence`` over the
trials the latest analysis pooled, judged on its metric and windows, so a run's row repeats the score
the verdict averaged (never a curve cut at another axis' horizon). Written as review.md, review.csv
and figures/review.png (the verdict-axis figure, its data in figures/review.csv), logged to every
iteration's MLflow parent run, with lineage tags (study, iteration, hypothesis, run key, verdict) on the
child runs so MLflow's search and compare views work. ``researcher report`` renders the same.
"""

from __future__ import annotations

import csv
import io
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from researcher.evidence import analysis, curves, plots, stats
from researcher.findings.records import Arm, Evidence, IterationPlan, IterationSummary
from researcher.runs import record as runs
from researcher.study import files as studyfiles
from researcher.study.layout import StudyLayout
from researcher.tracking.tracker import Tracker, unreachable
from swarm.atomic import write_atomic

log = logging.getLogger(__name__)
COLUMNS = ("iteration", "hypothesis", "experiment", "config", "seed", "status", "steps", "final_reward",
           "best_reward", "auc", "auc_episode", "auc_second", "wall_s", "cost_core_s", "verdict", "run_key", "mlflow_run_id")


class RunRow(BaseModel):
    """One training run in the review: the COLUMNS, plus what the MLflow tags and the plot need."""

    iteration: int
    hypothesis: str
    hypothesis_id: str
    experiment: str
    config: str                # the arm's overrides as sorted JSON
    seed: int
    status: str
    steps: int
    final_reward: float | None
    best_reward: float | None
    auc: float | None
    auc_episode: float | None
    auc_second: float | None
    wall_s: float | None
    cost_core_s: float | None
    verdict: str               # keep | discard | crashed (or the status of a run still going)
    run_key: str
    mlflow_run_id: str | None
    run_dir: str


@dataclass(frozen=True)
class Review:
    """The files ``write`` wrote, and the rows they show."""

    md: Path
    csv: Path
    png: Path
    rows: list[RunRow]


def _analyses(layout: StudyLayout) -> dict[int, IterationSummary]:
    found = {}
    for path in layout.artifacts_dir.glob("analysis-*.json"):
        summary = IterationSummary.model_validate_json(path.read_text())
        found[summary.iteration] = summary
    return found


def planned_trials(layout: StudyLayout, before: int) -> list[analysis.TrialRun]:
    """The runs of the iterations before ``before`` as evidence, with their arm's settings (plan.json)."""
    plan = studyfiles.read_plan(layout)
    found = []
    for record in runs.all_records(layout.runs_dir):
        exp = plan.iteration(record.iteration).experiment(record.experiment) if record.iteration < before else None
        if exp is not None:
            found.append(analysis.TrialRun(experiment=record.experiment, overrides=exp.settings,
                                           iteration=record.iteration, seed=record.seed, status=record.status,
                                           run_dir=str(layout.run_dir(record.iteration, record.trial))))
    return found


def judged(layout: StudyLayout) -> Evidence | None:
    """The latest analysis' pooled evidence recomputed from its runs on disk, run dirs included (the stored
    summary keeps numbers only): the same metric, knob and step horizon, hence the same windows and scores."""
    analyses = _analyses(layout)
    last = analyses[max(analyses)] if analyses else None
    if last is None or last.study is None:
        return None
    study = last.study
    judging = analysis.Judging(study.knob, study.metric, study.horizon, study.min_effect)
    return analysis.evidence(judging, planned_trials(layout, last.iteration + 1))


@dataclass(frozen=True)
class _Scored:
    arm: Arm
    index: int  # the run's place in the arm's runs, scores and finals


def table(layout: StudyLayout, metric: str = "train/reward_mean", study: Evidence | None = None) -> list[RunRow]:
    """One row per training run of the study, in run-key order; scored as ``study`` (default ``judged``)
    scored them."""
    plan = studyfiles.read_plan(layout)
    study = study if study is not None else judged(layout)
    scored = {run: _Scored(arm, i) for arm in (study.arms if study else []) for i, run in enumerate(arm.runs)}
    best = study.best if study else None
    return [_row(layout, record, plan.iteration(record.iteration), study.metric if study else metric,
                 scored.get(str(layout.run_dir(record.iteration, record.trial))), best)
            for record in runs.all_records(layout.runs_dir)]


def _row(layout: StudyLayout, record: runs.RunRecord, planned: IterationPlan, metric: str, scored: _Scored | None,
         best: str | None) -> RunRow:
    experiment = planned.experiment(record.experiment)
    hypotheses = {h.id: h.statement for h in planned.hypotheses}
    hyp_id = experiment.hypothesis if experiment else ""
    values = analysis.read_axes(layout.run_dir(record.iteration, record.trial), metric).values

    def score(axis: str) -> float | None:
        kept = scored.arm.scores.get(axis, []) if scored else []
        return round(kept[scored.index], 4) if scored and scored.index < len(kept) else None

    if scored is None:
        verdict = "crashed" if record.ended else record.status
        final = round(stats.final_level(values), 4) if values and not record.ended else None
    else:
        verdict = "keep" if scored.arm.name == best else "discard"
        final = round(scored.arm.finals[scored.index], 4)
    wall = record.wall_s
    return RunRow(
        iteration=record.iteration,
        hypothesis=f"{hyp_id}: {hypotheses.get(hyp_id, '')}".strip(": ") if hyp_id else "",
        hypothesis_id=hyp_id, experiment=record.experiment,
        config=json.dumps(experiment.overrides if experiment else {}, sort_keys=True),
        seed=record.seed, status=str(record.status), steps=record.last_step, final_reward=final,
        best_reward=round(max(values), 4) if values else None,
        auc=score("step"), auc_episode=score("episode"), auc_second=score("second"),
        wall_s=round(wall, 1) if wall is not None else None,
        cost_core_s=round(wall * record.threads, 1) if wall is not None else None,
        verdict=verdict, run_key=record.key, mlflow_run_id=record.mlflow_run_id,
        run_dir=str(layout.run_dir(record.iteration, record.trial)))


def to_csv(rows: list[RunRow]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(row.model_dump() for row in rows)
    return buffer.getvalue()


def to_markdown(study_id: str, rows: list[RunRow], plot_name: str | None, extra: str = "") -> str:
    def cell(value: object) -> str:
        return "" if value is None else str(value).replace("|", "\\|")

    header = ("iteration", "hypothesis", "experiment", "config", "seed", "status", "final", "best", "AUC/step",
              "AUC/episode", "AUC/second", "wall s", "cost core·s", "verdict", "run key")
    keys = ("iteration", "hypothesis", "experiment", "config", "seed", "status", "final_reward", "best_reward", "auc",
            "auc_episode", "auc_second", "wall_s", "cost_core_s", "verdict", "run_key")
    lines = [f"# Review of study {study_id}", ""] + ([extra, ""] if extra else [])
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(getattr(row, k)) for k in keys) + " |" for row in rows]
    if not rows:
        lines.append("| (no training runs yet) |" + " |" * (len(header) - 1))
    counts = {v: sum(1 for r in rows if r.verdict == v) for v in ("keep", "discard", "crashed")}
    lines += ["", f"Verdicts: {counts['keep']} keep, {counts['discard']} discard, {counts['crashed']} crashed "
                  "(keep = the study's best configuration, seeds pooled over iterations, on the verdict axis; crashed = no "
                  "usable curve)."]
    if plot_name:
        lines += ["", f"![reward curves of every run on a shared step axis]({plot_name})"]
    return "\n".join(lines) + "\n"


def plot(rows: list[RunRow], study: Evidence | None, path: Path, metric: str, title: str) -> Path:
    """The verdict's figure: each arm's runs on the verdict axis over the judged window (``plots``); before
    any analysis, each run's curve of ``metric`` per training step, one colour per experiment."""
    if study is not None:
        return plots.verdict_curves(study, path, title)
    shown = []
    for row in rows:
        steps, values = runs.read_curve(Path(row.run_dir), metric)
        shown.append(curves.SeedCurve(row.seed, [float(s) for s in steps], list(values), row.experiment))
    return plots.raw_curves(shown, path, metric, title)


def write(layout: StudyLayout, metric: str = "train/reward_mean") -> Review:
    """Write review.md/.csv and figures/review.png (with figures/review.csv) into the study folder."""
    study = judged(layout)
    rows = table(layout, metric, study)
    png = plot(rows, study, layout.study_dir / "figures" / "review.png", metric, f"{layout.study_id} · every run")
    csv_path = layout.study_dir / "review.csv"
    write_atomic(csv_path, to_csv(rows))
    md_path = layout.study_dir / "review.md"
    write_atomic(md_path, to_markdown(layout.study_id, rows, "figures/review.png"))
    return Review(md_path, csv_path, png, rows)


def log_to_mlflow(tracker: Tracker, layout: StudyLayout, written: Review) -> list[str]:
    """Attach the review to every iteration's parent run and tag each child run with its lineage and
    verdict; returns the parent run ids (empty when MLflow is unreachable: the review stays on disk)."""
    rows = written.rows
    for row in rows:
        tracker.set_tags(row.mlflow_run_id, {
            "researcher.study_id": layout.study_id, "researcher.iteration": str(row.iteration),
            "researcher.hypothesis_id": row.hypothesis_id, "researcher.run_key": row.run_key,
            "researcher.experiment": row.experiment, "researcher.verdict": row.verdict})
    try:
        found = tracker.client.get_experiment_by_name(layout.study_id)
        if found is None:
            return []
        candidates = tracker.client.search_runs([found.experiment_id], filter_string="tags.`researcher.kind` = 'iteration'",
                                                max_results=1000)
    except Exception as exc:
        if unreachable(exc):
            log.warning("MLflow unreachable; the review stays in %s", layout.study_dir)
            return []
        raise
    parents = []
    for run in candidates:
        iteration = run.data.tags.get("researcher.iteration", "")
        mine = [r for r in rows if str(r.iteration) == iteration]
        tracker.log_files(run.info.run_id, [written.md, written.csv], "review")
        tracker.log_files(run.info.run_id, [written.png], "review/figures")  # where review.md points
        tracker.set_tags(run.info.run_id, {
            "researcher.hypothesis_ids": ",".join(sorted({r.hypothesis_id for r in mine if r.hypothesis_id})),
            "researcher.kept": ",".join(sorted({r.experiment for r in mine if r.verdict == "keep"}))})
        try:
            tracker.client.log_table(data={c: [getattr(r, c) for r in rows] for c in COLUMNS},
                                     artifact_file="review/review_table.json", run_id=run.info.run_id)
        except Exception as exc:  # the table is a convenience; the CSV is already there
            log.info("log_table failed for %s: %s", run.info.run_id, exc)
        parents.append(run.info.run_id)
    return parents
