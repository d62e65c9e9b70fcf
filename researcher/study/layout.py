"""Where one study's files live: small reviewable text in studies/, heavy outputs in artifacts/.

``studies/<id>/``: study.toml, plan.json, experiments/<name>/{client.py,config.toml}, LOG.md,
report.md. ``artifacts/<id>/``: graph.db (LangGraph checkpoints), study.lock, STOP (a stop request),
runs/<iteration>-<trial>/ (run.json, server and client logs, server state), plots, planner calls.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_STUDY_ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,79}")  # whole id (fullmatch): "$" would let "id\n" through


def check_study_id(study_id: str) -> str:
    """Study ids become directory names and MLflow experiment names: keep them boring."""
    if not _STUDY_ID.fullmatch(study_id) or study_id in {"examples"} or ".." in study_id:
        raise ValueError(f"invalid study id {study_id!r}: use 1-80 lowercase letters, digits, '.', '_' or '-' "
                         "(and not 'examples')")
    return study_id


def slugify(text: str, limit: int = 40) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug[:limit].strip("-") or "study"


@dataclass(frozen=True)
class StudyLayout:
    study_id: str
    studies_root: Path
    artifacts_root: Path

    @property
    def study_dir(self) -> Path:
        return self.studies_root / self.study_id

    @property
    def artifacts_dir(self) -> Path:
        return self.artifacts_root / self.study_id

    @property
    def study_toml(self) -> Path:
        return self.study_dir / "study.toml"

    @property
    def plan_json(self) -> Path:
        return self.study_dir / "plan.json"

    @property
    def log_md(self) -> Path:
        return self.study_dir / "LOG.md"

    @property
    def report_md(self) -> Path:
        return self.study_dir / "report.md"

    @property
    def graph_db(self) -> Path:
        return self.artifacts_dir / "graph.db"

    @property
    def lock_file(self) -> Path:
        return self.artifacts_dir / "study.lock"

    @property
    def stop_file(self) -> Path:
        return self.artifacts_dir / "STOP"

    @property
    def runs_dir(self) -> Path:
        return self.artifacts_dir / "runs"

    @property
    def plots_dir(self) -> Path:
        return self.artifacts_dir / "plots"

    @property
    def llm_calls_dir(self) -> Path:
        return self.artifacts_dir / "llm_calls"

    def experiment_dir(self, name: str) -> Path:
        return self.study_dir / "experiments" / name

    def run_dir(self, iteration: int, trial: int) -> Path:
        return self.runs_dir / f"{iteration:02d}-{trial:02d}"

    def smoke_dir(self, iteration: int, attempt: int) -> Path:
        return self.artifacts_dir / "smoke" / f"{iteration:02d}-{attempt:02d}"

    def ensure(self) -> None:
        self.study_dir.mkdir(parents=True, exist_ok=True)
        self.artifacts_dir.mkdir(parents=True, exist_ok=True)


def run_key(study_id: str, iteration: int, trial: int) -> str:
    """The idempotency key of one training run: ``study/iteration/trial``."""
    return f"{study_id}/{iteration}/{trial}"
