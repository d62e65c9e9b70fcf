"""What the links the researcher writes open in MLflow's UI: the training view, the runs grouped by arm,
the verdict's metric charted first.

Written against MLflow 3.17's built UI (``mlflow/server/js/build/static/js``), which honours only this:

- ``workflowType=machine_learning`` in the URL: the model-training view. Without it the UI opens the GenAI
  view (the workflow context in ``main.*.js``, default ``genai``, falls back to the browser's stored choice).
- ``#/experiments/<id>/runs?compareRunsMode=CHART``: the runs page with its charts. The bare experiment route
  ``#/experiments/<id>`` redirects to that tab keeping only ``startTime``, ``endTime``, ``workflowType`` and
  ``workspace``, so links go to ``/runs`` directly.
- ``viewStateShareKey=<id>``: applies the saved view stored in the experiment tag
  ``mlflow.sharedViewState.<id>``: a JSON envelope ``{name, createdAt, updatedAt, state}`` whose state sets
  the grouping (``groupBy``), the charts (``compareRunCharts``) and their sections (``compareRunSections``,
  kept in our order by ``isAccordionReordered``). The runs page lists it under "Views" too; while it is
  applied MLflow shows a "You're viewing a shared view" banner. Metrics the view does not name get
  MLflow's own charts, in sections after ours.

Not honoured by 3.17, so not attempted: a default view for an experiment (the UI keeps a reader's view in
browser localStorage only; the plain experiment page, as the experiments list opens it, is ungrouped), and
grouping or charts as URL parameters. A run page opened from the runs table leaves the training view: the
table's run links carry no ``workflowType`` and the page falls back to the browser's stored choice (GenAI
until the reader switches the sidebar to "Model training"). The run links written here carry it. The same
holds for the experiments list: a click opens the experiment in the stored choice, whatever its
``mlflow.experimentKind`` tag (``KIND_TAG``, which MLflow's experiment-type selector writes; checked by
clicking in headless Chromium). The researcher still sets that tag to model training on each study's
experiment, MLflow's own record of what the experiment holds, and `researcher ui` prints each study's link
to its runs in the saved view beside the list's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

VIEW_ID = "by-arm"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_ID}"  # the saved-view tag prefix of MLflow's UI
TRAINING_VIEW = "workflowType=machine_learning"
# MLflow's experiment-type tag, set to model training (``ExperimentKind.CUSTOM_MODEL_DEVELOPMENT`` in ``main.*.js``).
KIND_TAG, TRAINING_KIND = "mlflow.experimentKind", "custom_model_development"
ARM_TAG = "arm"  # the training runs' tag naming their arm's configuration (arm_label; researcher.session.nodes.launch_runs)
VERDICT_SECTION = "verdict"


def view_name(metric: str) -> str:
    return f"By arm, {metric} first"


# The server's cumulative episodes through each step (swarm.server.training.ledger.TOTAL_EPISODES): the x-axis of a
# verdict judged per episode consumed (arms matched on episodes train different steps).
EPISODES_METRIC = "train/episodes_total"
# The same count logged beside each held-out round, at the round's steps only (swarm.server.training.step_rows):
# MLflow's UI pairs a chart's x and y metrics by their position in the two histories, not by step, so an
# ``eval/*`` metric against ``train/episodes_total`` (logged every step) draws its points at the wrong x.
EVAL_EPISODES_METRIC = "eval/episodes_total"


def x_metric(metric: str) -> str:
    """The episodes count logged at exactly the steps ``metric`` is: the held-out one for ``eval/*``."""
    return EVAL_EPISODES_METRIC if metric.startswith("eval/") else EPISODES_METRIC


def arm_label(settings: Mapping[str, object], twin: int = 0) -> str:
    """The ``ARM_TAG`` value of a run: its arm's configuration (``group_size=2``, settings as sorted
    ``k=v`` joined by ``", "``; ``defaults`` for none), so runs of one configuration group together across
    iterations as the verdict pools them (``researcher.evidence.analysis``). ``twin``: how many arms of the
    same iteration had the same settings before this one (an A/A check keeps them apart: `` #2``, …),
    which pools the n-th twin of each iteration."""
    label = ", ".join(f"{k}={_value(v)}" for k, v in sorted(settings.items())) or "defaults"
    return f"{label} #{twin + 1}" if twin else label


def _value(value: object) -> str:
    """A setting as a config file writes it (``true``, ``0.001``, ``[1, 2]``), a string unquoted."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def saved_view(metric: str, created_ms: int, updated_ms: int, axis: str = "step") -> str:
    """The experiment tag value of the saved view: runs grouped by the ``arm`` tag (charted as each arm's
    mean), ``metric`` alone in the first chart section at full width, MLflow's charts of the rest below.
    The chart's x-axis is the verdict's ``axis``: training steps, or episodes consumed (``x_metric``: the
    count logged at the metric's own steps)."""
    x_axis = ({"xAxisKey": "metric", "selectedXAxisMetricKey": x_metric(metric), "useGlobalXaxisKey": False}
              if axis == "episode" else {"xAxisKey": "step", "selectedXAxisMetricKey": "", "useGlobalXaxisKey": True})
    chart = {"uuid": "verdict-metric", "type": "LINE", "metricSectionId": VERDICT_SECTION, "metricKey": metric,
             "selectedMetricKeys": [metric], "displayName": metric, "isGenerated": False, "deleted": False,
             "runsCountToCompare": 10, "xAxisScaleType": "linear", "scaleType": "linear",
             "lineSmoothness": 0, "useGlobalLineSmoothing": True, "yAxisKey": "metric",
             "yAxisExpressions": [], "ignoreOutliers": False, "range": {}, **x_axis}
    section = {"uuid": VERDICT_SECTION, "name": "The verdict's metric", "display": True, "isReordered": True,
               "deleted": False, "columns": 1}
    state = {"groupBy": {"aggregateFunction": "average", "groupByKeys": [{"mode": "tag", "groupByData": ARM_TAG}]},
             "useGroupedValuesInCharts": True, "compareRunCharts": [chart], "compareRunSections": [section],
             "isAccordionReordered": True}
    return json.dumps({"name": view_name(metric), "createdAt": created_ms, "updatedAt": updated_ms,
                       "state": json.dumps(state)})


def experiment_page(experiment_id: str | None, with_view: bool) -> str:
    """The UI route (after ``#``) of an experiment's runs in the training view: charted and grouped by
    arm where the experiment holds the saved view; every experiment when ``experiment_id`` is None."""
    if experiment_id is None:
        return f"/experiments?{TRAINING_VIEW}"
    query = f"{TRAINING_VIEW}&compareRunsMode=CHART&viewStateShareKey={VIEW_ID}" if with_view else TRAINING_VIEW
    return f"/experiments/{experiment_id}/runs?{query}"


def run_page(experiment_id: str, run_id: str, artifact: str | None = None) -> str:
    """The UI route (after ``#``) of a run, or of one of its artifacts, in the training view."""
    tail = f"/artifactPath/{artifact}" if artifact else ""
    return f"/experiments/{experiment_id}/runs/{run_id}{tail}?{TRAINING_VIEW}"


def study_links(root: str, experiments: Iterable[Any], shown: int = 5) -> list[str]:
    r"""Lines for `researcher ui` without a study: a link per study (an experiment holding the saved view) to
    its runs in that view, for the first ``shown`` of ``experiments`` (MLflow ``Experiment``\ s, newest
    first), then how many more there are; none when no study has a view yet."""
    studies = [e for e in experiments if VIEW_TAG in e.tags]
    lines = [f"  {e.name}: {root}/#{experiment_page(e.experiment_id, with_view=True)}" for e in studies[:shown]]
    if len(studies) > shown:
        lines.append(f"  … {len(studies) - shown} more: researcher ui STUDY")
    return ["Studies, newest first (runs by arm, the verdict's metric charted first):", *lines] if lines else []
