"""campaign.json: what a campaign has done, the one file its runner writes (atomically, after every step).

It holds the campaign's clock (the running budget spent, per claim), each claim's verdict history as
its seeds accumulated, and the session in progress, written before that session starts: a campaign
process killed mid-session finds it on resume, waits for the study's session if it still runs and
books its time, so nothing is counted twice or lost. Everything else (runs, verdicts, reports) is
read from the claims' studies, which are ordinary studies (``researcher status`` lists them).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from researcher.campaign.discovery import Discovery, Stage
from researcher.campaign.goal import Goal
from researcher.operations import scheduler
from researcher.study.layout import StudyLayout
from swarm.atomic import write_atomic

CAMPAIGN_FILE = scheduler.CAMPAIGN_FILE  # the daemon tells a campaign's folder from a study's by it
SPEC_FILE = "campaign.toml"
LEDGER_FILE = "ledger.md"


class LookEntry(BaseModel):
    """A claim's standing after one of its study's looks."""

    look: int
    seeds: int                     # per arm
    verdict: str                   # a verdicts.Verdict value, or "no verdict yet"
    diff: float | None = None      # the compared difference (better − worse) and its look's half width
    hw: float | None = None
    better: str = ""
    needed_seeds: int | None = None
    at: float = Field(default_factory=time.time)
    mlflow_runs: list[str] = Field(default_factory=list)


class ClaimRecord(BaseModel):
    index: int
    study_id: str
    task: str | None = None        # the example task its study is framed on (baselines are per task)
    note: str = ""
    spent_s: float = 0.0           # campaign running time its sessions took
    sessions: int = 0
    looks: list[LookEntry] = Field(default_factory=list)
    phase: str = "not started"     # its study's phase after the last session
    verdict: str | None = None     # once its study ended: the answer to the claim's own question
    study_verdict: str | None = None  # the study's Answer class (to the study's Question), which verdict turns
    cpu_hours: float = 0.0         # its runs' wall time x their torch threads
    baseline: dict[str, Any] | None = None  # settled findings it started from
    baseline_from: list[str] = Field(default_factory=list)  # the study ids they came from
    stage: Stage | None = None     # a goal campaign's: the discovery stage its study runs
    recorded: bool = False         # the stage's outcome is in the campaign's search state

    @property
    def closed(self) -> bool:
        return self.phase in ("done", "failed", "stopped")


class Session(BaseModel):
    claim: int
    started: float


class CampaignRecord(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    budget_s: float
    window: str | None = None
    created: float = Field(default_factory=time.time)
    cwd: str = Field(default_factory=os.getcwd)  # where it was started: its sessions run there (relative paths)
    study_deadline: float          # the claims' studies' wall deadline (budget, stretched over the windows)
    claims: list[ClaimRecord]
    session: Session | None = None
    ended: str | None = None       # why the campaign ended ("" while it runs)
    baselines: dict[str, dict[str, Any]] = Field(default_factory=dict)  # task -> config keys, settled
    baseline_sources: dict[str, list[str]] = Field(default_factory=dict)  # task -> study ids behind them
    added: list[dict[str, Any]] = Field(default_factory=list)  # claims its screen added (spec.Claim fields)
    screened: bool = False         # the screen's confirmations were added (once)
    goal: Goal | None = None       # a goal campaign: what it pursues, and its search state
    discovery: Discovery | None = None
    notes: list[str] = Field(default_factory=list)  # what the search decided between stages, in order

    @property
    def spent_s(self) -> float:
        return sum(c.spent_s for c in self.claims)

    @property
    def left_s(self) -> float:
        return max(self.budget_s - self.spent_s, 0.0)


def claim_study_id(name: str, index: int) -> str:
    return f"{name}-c{index + 1}"


def folder(studies_root: Path, name: str) -> Path:
    return studies_root / name


def layout(studies_root: Path, artifacts_root: Path, name: str) -> StudyLayout:
    """The campaign's folders and lock, shaped like a study's (``studies/<name>``, ``artifacts/<name>``),
    so the scheduler's lock test and session log work on a campaign as on a study."""
    return StudyLayout(name, studies_root, artifacts_root)


def load(studies_root: Path, name: str) -> CampaignRecord | None:
    path = folder(studies_root, name) / CAMPAIGN_FILE
    if not path.is_file():
        return None
    return CampaignRecord.model_validate(json.loads(path.read_text()))


def save(studies_root: Path, record: CampaignRecord) -> None:
    write_atomic(folder(studies_root, record.name) / CAMPAIGN_FILE, record.model_dump_json(indent=2) + "\n")


def is_campaign(studies_root: Path, name: str) -> bool:
    return (folder(studies_root, name) / CAMPAIGN_FILE).is_file()


def names(studies_root: Path) -> list[str]:
    return sorted(p.parent.name for p in studies_root.glob(f"*/{CAMPAIGN_FILE}")) if studies_root.is_dir() else []
