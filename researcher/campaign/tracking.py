"""The campaign's MLflow experiment, ``campaign-<name>``: one run a claim, with its topic, expectation,
source and study as tags, its verdict history as metrics by look (the difference, the look's interval
half width, seeds an arm), its CPU-hours, and the MLflow run ids of the study's runs behind each number.

A view of campaign.json, rewritten after every session: a claim's run is found again by its tag, and
only looks not yet logged are added. MLflow being away costs the view only (a warning): the ledger
and campaign.json are the record.
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Any

from researcher.campaign.ledger import scores
from researcher.campaign.record import CampaignRecord
from researcher.campaign.spec import CampaignSpec

log = logging.getLogger(__name__)


def experiment_name(campaign: str) -> str:
    return f"campaign-{campaign}"


def log_campaign(tracking_uri: str, spec: CampaignSpec, rec: CampaignRecord) -> None:
    try:
        _log(tracking_uri, spec, rec)
    except Exception as exc:  # the view only; the ledger holds everything
        log.warning("could not update the campaign's MLflow experiment: %s", exc)


def _log(tracking_uri: str, spec: CampaignSpec, rec: CampaignRecord) -> None:
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    client = MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment_name(rec.name))
    experiment = found.experiment_id if found else client.create_experiment(experiment_name(rec.name))
    runs = {r.data.tags.get("claim"): r for r in client.search_runs([experiment], max_results=1000)}
    for score in scores(spec, rec):
        claim, cr = score.claim, score.record
        run = runs.get(str(cr.index + 1))
        run_id = run.info.run_id if run else client.create_run(
            experiment, run_name=f"c{cr.index + 1}: {claim.topic[:80]}", tags={"claim": str(cr.index + 1)}).info.run_id
        logged = int(run.data.tags.get("looks_logged", "0")) if run else 0
        now = int(time.time() * 1000)
        metrics = []
        for lk in cr.looks[logged:]:
            metrics.append(Metric("look/seeds", float(lk.seeds), now, lk.look))
            if lk.diff is not None:
                metrics.append(Metric("look/diff", lk.diff, now, lk.look))
            if lk.hw is not None and math.isfinite(lk.hw):
                metrics.append(Metric("look/half_width", lk.hw, now, lk.look))
        metrics += [Metric("cpu_hours", cr.cpu_hours, now, len(cr.looks)),
                    Metric("spent_minutes", cr.spent_s / 60, now, len(cr.looks))]
        tags = {"topic": claim.topic[:5000], "expect": claim.expect, "source": claim.source or "-",
                "study_id": cr.study_id, "phase": cr.phase, "verdict": score.shown_verdict,
                "agrees": {True: "yes", False: "no", None: "-"}[score.agrees], "looks_logged": str(len(cr.looks)),
                "study_runs": ",".join(cr.looks[-1].mlflow_runs)[:5000] if cr.looks else ""}
        client.log_batch(run_id, metrics=metrics)
        for key, value in tags.items():
            client.set_tag(run_id, key, value)
        if cr.closed and (not run or run.info.status != "FINISHED"):
            client.set_terminated(run_id, "FINISHED")
    if rec.discovery is not None:
        _log_search(client, experiment, runs.get("search"), rec)


def _log_search(client: Any, experiment: str, run: Any, rec: CampaignRecord) -> None:
    """The goal campaign's parent run: the incumbent's objective after each round that measured it, and the
    headline as a tag."""
    from mlflow.entities import Metric

    d = rec.discovery
    assert d is not None
    run_id = run.info.run_id if run else client.create_run(
        experiment, run_name=f"search: {rec.goal.text[:80] if rec.goal else rec.name}", tags={"claim": "search"}).info.run_id
    now = int(time.time() * 1000)
    objective: dict[int, float] = {}
    for t in d.tests:
        kept = t.treatment if (t.held and t.kind == "combine") or t.kind == "verify" else t.control
        if kept is not None:
            objective[t.round] = kept
    logged = int(run.data.tags.get("rounds_logged", "0")) if run else 0
    done = max((r for r in objective if r < d.round or d.converged), default=0)  # a round's value is final once it ends
    client.log_batch(run_id, metrics=[Metric("search/incumbent_objective", value, now, r)
                                      for r, value in sorted(objective.items()) if logged < r <= done])
    client.set_tag(run_id, "rounds_logged", str(max(done, logged)))
    client.set_tag(run_id, "headline", d.headline()[:5000])
    client.set_tag(run_id, "incumbent", json.dumps(d.incumbent, default=str)[:5000])
    if rec.ended and (not run or run.info.status != "FINISHED"):
        client.set_terminated(run_id, "FINISHED")
