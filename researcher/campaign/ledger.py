"""The campaign's findings in words: ``studies/<campaign>/ledger.md`` and the scorecard.

The ledger lists each claim with its verdict history as seeds accumulated (every look, with the MLflow
runs behind its number), the CPU-hours spent on it, and which settled findings became a task's baseline.
The scorecard is one line a claim and a ``RESULT`` line: decisive means Yes, No or No meaningful
difference as the answer to the claim's own question (``standing.as_claimed`` turns the study's Answer
where the two ask opposite ways); agree means that verdict is the one the claim expected. An open question's
screen has a line (what it flagged) but is not a claim the RESULT counts.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from researcher.campaign.levels import describe
from researcher.campaign.record import CampaignRecord, ClaimRecord
from researcher.campaign.spec import CampaignSpec, Claim
from researcher.findings.verdicts import Verdict

EXPECTED = {"yes": Verdict.YES.value, "no": Verdict.NO.value, "no meaningful difference": Verdict.NO_DIFFERENCE.value}
DECISIVE = tuple(EXPECTED.values())


@dataclass(frozen=True)
class Score:
    claim: Claim
    record: ClaimRecord

    @property
    def decisive(self) -> bool:
        return self.record.closed and self.record.verdict in DECISIVE

    @property
    def agrees(self) -> bool | None:
        """Whether the decisive verdict is the expected one (None: not decisive)."""
        return self.record.verdict == EXPECTED[self.claim.expect] if self.decisive else None

    @property
    def shown_verdict(self) -> str:
        if self.record.closed:
            return self.record.verdict or f"no verdict ({self.record.phase})"
        latest = self.record.looks[-1].verdict if self.record.looks else "not started"
        return f"open ({latest} at look {len(self.record.looks)})" if self.record.looks else "not started"

    @property
    def seeds(self) -> int:
        return self.record.looks[-1].seeds if self.record.looks else 0


def scores(spec: CampaignSpec, record: CampaignRecord) -> list[Score]:
    return [Score(claim, rec) for claim, rec in zip(spec.claim, record.claims, strict=True)]


def _agree_word(score: Score) -> str:
    return {True: "agrees", False: "disagrees", None: "-"}[score.agrees]


def scorecard(spec: CampaignSpec, record: CampaignRecord) -> list[str]:
    """One line a claim, then ``RESULT claims=<n> decisive=<n> agree=<n> disagree=<n> cpu_hours=<h>``."""
    lines, rows = [], scores(spec, record)
    for s in rows:
        lines.append(f"c{s.record.index + 1} expect {s.claim.expect!r}: {s.shown_verdict} · {_agree_word(s)} · "
                     f"{s.seeds} seeds an arm · {s.record.cpu_hours:.2f} CPU-h · {s.record.study_id} · "
                     f"{s.claim.topic}" + (f" ({s.claim.source})" if s.claim.source else ""))
    rows = [s for s in rows if s.claim.expect not in ("screen", "stage")]  # selections and a goal's own stages
    decisive = [s for s in rows if s.decisive]
    lines.append(f"RESULT claims={len(rows)} decisive={len(decisive)} agree={sum(s.agrees is True for s in decisive)} "
                 f"disagree={sum(s.agrees is False for s in decisive)} "
                 f"cpu_hours={sum(r.cpu_hours for r in record.claims):.2f}")
    return lines


def _duration(seconds: float) -> str:
    minutes = int(seconds // 60)
    return f"{minutes // 60}h {minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m {int(seconds % 60):02d}s"


def _interval(diff: float | None, hw: float | None) -> str:
    if diff is None:
        return "-"
    return f"{diff:+.3f} ± {hw:.3f}" if hw is not None and hw != float("inf") else f"{diff:+.3f} (no interval yet)"


def search_lines(record: CampaignRecord) -> list[str]:
    """A goal campaign's search: its goal, headline, incumbent and round, what each stage decided, and its
    figures (nothing for a campaign of claims)."""
    d, goal = record.discovery, record.goal
    if d is None or goal is None:
        return []
    where = "converged" if d.converged else f"round {d.round}, {d.step}"
    out = ["", f"Goal: {goal.text} (read as {goal.describe()}).", "", f"**{d.headline()}**", "",
           f"Search: {where} · incumbent {describe(d.incumbent, d.defaults)} · {len(d.tests)} confirmation(s) "
           f"tested, at most a {d.budget.alpha:.0%} chance of any false one (the online fallback procedure)."]
    if d.converged:
        out += ["", f"Why it stopped: {d.converged}."]
    out += ["", *[f"- {line}" for line in record.notes]] if record.notes else []
    out += ["", "![the incumbent's objective against CPU-hours](figures/progress.png)", "",
            "![every confirmation's effect and interval, by round](figures/forest.png)"] if d.tests else []
    return out


def render(spec: CampaignSpec, record: CampaignRecord) -> str:
    started = dt.datetime.fromtimestamp(record.created).isoformat(timespec="minutes")
    state = f"ended: {record.ended}" if record.ended else ("running" if record.session else "parked")
    out = [f"# Campaign {record.name}", "",
           f"Budget {_duration(record.budget_s)} of running time: spent {_duration(record.spent_s)}, "
           f"{_duration(record.left_s)} left · " + (f"window {record.window} · " if record.window else "")
           + f"started {started} · {state}.", "",
           "Written by the campaign after every session; each claim is an ordinary study (`researcher status ID`).",
           *search_lines(record),
           "", "| claim | expected | verdict | | seeds an arm | CPU-h | study |", "|---|---|---|---|---|---|---|"]
    rows = scores(spec, record)
    for s in rows:
        out.append(f"| c{s.record.index + 1}: {s.claim.topic} | {s.claim.expect} | {s.shown_verdict} | "
                   f"{_agree_word(s)} | {s.seeds} | {s.record.cpu_hours:.2f} | `{s.record.study_id}` |")
    for task, keys in sorted(record.baselines.items()):
        settings = ", ".join(f"{k}={v}" for k, v in keys.items())
        out += ["", f"Baseline for {task} is now {settings} (settled in {', '.join(record.baseline_sources[task])}); "
                    "later claims on it start from there."]
    for s in rows:
        out += ["", f"## c{s.record.index + 1}: {s.claim.topic}", "",
                f"Expected: {s.claim.expect}" + (f" ({s.claim.source})" if s.claim.source else "")
                + f" · study `{s.record.study_id}` ({s.record.phase}) · {s.record.sessions} session(s), "
                f"{_duration(s.record.spent_s)} · {s.record.cpu_hours:.2f} CPU-h."]
        study_said = s.record.study_verdict
        if study_said and s.record.verdict and study_said != s.record.verdict:
            out += ["", f"Its study's Answer to the study's own Question is {study_said}; to this claim's question "
                        f"it is {s.record.verdict}."]
        if s.record.baseline:
            settings = ", ".join(f"{k}={v}" for k, v in s.record.baseline.items())
            out += ["", f"Started from the baseline {settings} (settled in {', '.join(s.record.baseline_from)})."]
        if s.record.looks:
            out += ["", "| look | seeds an arm | verdict | difference (look's interval) | ahead | MLflow runs |",
                    "|---|---|---|---|---|---|"]
            for lk in s.record.looks:
                out.append(f"| {lk.look} | {lk.seeds} | {lk.verdict} | {_interval(lk.diff, lk.hw)} | {lk.better or '-'} | "
                           f"{', '.join(lk.mlflow_runs) or '-'} |")
    return "\n".join(out) + "\n"
