"""The soak's end-of-run checks, from what the processes themselves recorded.

- **Episodes**: a client logs ``finished episode <id>`` once the server acknowledged its finish
  (``swarm.client._runner``); the run's server keeps every finished episode and which live step
  trained it in ``<state dir>/buffer.db`` (``swarm.server.durability.store``). *Lost*: acknowledged by a client,
  absent from the store. *Twice*: trained by more than one step of the final lineage (a step rolled
  back by a restart from an older checkpoint does not count).
- **Runs**: each run's ``run.json`` counts its server launches (``launches`` > 1: launched twice), and
  MLflow holds one child run per run key (``researcher.run_key``): a second is a duplicate.
- **MLflow**: every run's ``train/reward_mean`` history has each step 1..``last_step`` of run.json,
  no step missing and none past it.
- **Verdict**: the class of each study's Answer (``researcher.findings.verdicts.answer_class``).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from researcher.findings.verdicts import answer_class
from researcher.runs import record as runs
from researcher.runs.logs import CLIENT_LOG
from researcher.study.layout import StudyLayout
from researcher.tracking.spool import LOCAL_PREFIX, Spool
from swarm.server.durability.store import EpisodeStore

FINISHED = re.compile(r"finished episode (\S+) \(task")


@dataclass
class Audit:
    lost: int = 0
    twice: int = 0
    duplicate_runs: int = 0
    mlflow_gaps: int = 0
    acknowledged: int = 0
    trained: int = 0
    notes: list[str] = field(default_factory=list)


def acknowledged_episodes(run_dir: Path) -> set[str]:
    """Episode ids whose finish the run's clients saw acknowledged (every client start appends to client.log)."""
    path = run_dir / CLIENT_LOG
    if not path.is_file():
        return set()
    return set(FINISHED.findall(path.read_text(errors="replace")))


def episodes(audit: Audit, runs_dir: Path) -> None:
    for record in runs.all_records(runs_dir):
        if record.launches == 0 or not record.state_dir:
            continue
        run_dir = Path(record.state_dir).parent  # <run dir>/server
        acked = acknowledged_episodes(run_dir)
        db = Path(record.state_dir) / "buffer.db"
        if not db.is_file():
            audit.lost += len(acked)
            audit.notes.append(f"{record.key}: no buffer.db, {len(acked)} acknowledged episodes")
            continue
        with EpisodeStore(db) as store:
            lost = [e for e in acked if not store.known(e)]  # stored, or pruned by retention
            twice = {e: n for e, n in store.trained_counts().items() if n > 1}
            audit.trained += len(store.trained_counts())
        audit.acknowledged += len(acked)
        audit.lost += len(lost)
        audit.twice += len(twice)
        if lost:
            audit.notes.append(f"{record.key}: lost {len(lost)} acknowledged episodes, e.g. {lost[:3]}")
        if twice:
            audit.notes.append(f"{record.key}: {len(twice)} episodes trained twice, e.g. {list(twice.items())[:3]}")


def duplicate_runs(audit: Audit, runs_dir: Path, mlflow_client, study_id: str) -> None:
    records = runs.all_records(runs_dir)
    twice = [r.key for r in records if r.launches > 1]
    audit.duplicate_runs += len(twice)
    if twice:
        audit.notes.append(f"{study_id}: runs launched more than once: {twice}")
    experiment = mlflow_client.get_experiment_by_name(study_id)
    if experiment is None:
        audit.duplicate_runs += 1
        audit.notes.append(f"{study_id}: no MLflow experiment")
        return
    found = mlflow_client.search_runs([experiment.experiment_id], max_results=1000)
    per_key = Counter(r.data.tags["researcher.run_key"] for r in found if "researcher.run_key" in r.data.tags)
    extra = {k: n for k, n in per_key.items() if n > 1}
    audit.duplicate_runs += sum(n - 1 for n in extra.values())
    if extra:
        audit.notes.append(f"{study_id}: several MLflow runs for one run key: {extra}")


def mlflow_steps(audit: Audit, runs_dir: Path, spool_dir: Path, mlflow_client) -> None:
    """A run created while MLflow was away keeps its spool id (``local-…``) in run.json; the spool's
    ``ids.json`` maps it to the real run once replayed."""
    spool = Spool(spool_dir)
    for record in runs.all_records(runs_dir):
        if record.launches == 0:
            continue
        run_id = record.mlflow_run_id
        if run_id and run_id.startswith(LOCAL_PREFIX):
            run_id = spool.real_id(run_id)
        if not run_id or run_id.startswith(LOCAL_PREFIX):
            audit.mlflow_gaps += 1
            audit.notes.append(f"{record.key}: no MLflow run (id {record.mlflow_run_id!r})")
            continue
        steps = {m.step for m in mlflow_client.get_metric_history(run_id, "train/reward_mean")}
        expected = set(range(1, record.last_step + 1))
        if steps != expected:
            audit.mlflow_gaps += 1
            missing, extra = sorted(expected - steps), sorted(steps - expected)
            audit.notes.append(f"{record.key}: MLflow steps differ from run.json's {record.last_step}: "
                               f"missing {missing[:10]}, beyond {extra[:10]}")


def answer(layout: StudyLayout) -> tuple[str | None, str]:
    """(class, Answer text) of a study's report; (None, why) without one."""
    if not layout.report_md.is_file():
        return None, "no report.md"
    parts = layout.report_md.read_text().split("## Answer", 1)
    if len(parts) < 2:
        return None, "no Answer in report.md"
    text = parts[1].strip().split("\n\n", 1)[0]
    verdict = answer_class(text)
    return (verdict.value if verdict else None), text
