"""What a reviewer meets in MLflow first (a real SQLite store): the arm as a tag and a run-name prefix that
survives the runs list's truncation, no flat-zero ``context/*`` charts, the answer's headline on the
description's first line, and `researcher ui`'s link opening the runs grouped by arm with the verdict's
metric charted first, rendered by headless Chromium against the real MLflow UI."""

from __future__ import annotations

import html
import json
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import httpx
from support import free_port, wait_for
from support.stops import terminate

from researcher.findings.records import IterationPlan, PlannedExperiment
from researcher.session.nodes import write_report
from researcher.session.nodes.launch_runs import _arm_letter, _arm_tag
from researcher.tracking import review_view
from researcher.tracking.tracker import Tracker
from swarm.protocol import StepMetrics
from swarm.server.training.ledger import TOTAL_EPISODES
from swarm.server.training.step_rows import EVAL_EPISODES, TRAIN_EPISODES


def test_context_metrics_are_logged_only_once_they_move(tmp_path: Path) -> None:
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "art")
    run = tracker.start_child("study", None, "A it1-g8 s0", {"lr": 0.1}, {"arm": "it1-g8"})

    def step(n: int, forks: float) -> StepMetrics:
        return StepMetrics(step=n, policy_version=n, time=1000.0 + n,
                           metrics={"train/reward_mean": 0.1 * n, "context/forks": forks, "context/merged": 0.0})

    tracker.log_steps(run, [step(1, 0.0), step(2, 0.0)])
    tracker.log_steps(run, [step(3, 2.0), step(4, 0.0)])
    real = tracker.real_id(run)
    logged = tracker.client.get_run(real).data
    assert "context/merged" not in logged.metrics  # zero all along: never charted
    history = tracker.client.get_metric_history(real, "context/forks")
    assert [(m.step, m.value) for m in history] == [(3, 2.0), (4, 0.0)]  # from the first move on, zeros too
    assert len(tracker.client.get_metric_history(real, "train/reward_mean")) == 4
    assert logged.tags["arm"] == "it1-g8"
    # The study's experiment is a model-training one: MLflow's experiments list opens it on its runs.
    experiment = tracker.client.get_experiment_by_name("study")
    assert experiment.tags[review_view.KIND_TAG] == review_view.TRAINING_KIND == "custom_model_development"


def test_run_names_start_with_the_arm_letter() -> None:
    trials = [{"experiment": e, "seed": s} for e in ("it2-group-size-16", "it2-group-size-8") for s in (0, 1)]
    state = {"trials": trials}
    assert [_arm_letter(state, t) for t in trials] == ["A", "A", "B", "B"]  # type: ignore[arg-type]


def test_the_description_leads_with_the_answers_headline_on_one_line() -> None:
    answer = ("With the same number of training steps, group_size=8 learns the letters task faster than "
              "group_size=2:\nthe area under eval/reward_mean is 0.21 ± 0.03 higher. Per episode no difference.")
    text = write_report.description("done", answer, "Question: q", "Topic: t")
    first, whole, *rest = text.split("\n\n")
    assert first == "Answer (done): With the same number of training steps, group_size=8 learns the letters task faster…"
    assert len(first) <= write_report.HEADLINE_CHARS and whole == " ".join(answer.split()) and rest == ["Question: q", "Topic: t"]
    short = write_report.description("stopped", "No answer: the topic could not be framed.", "Topic: t")
    assert short == "Answer (stopped): No answer: the topic could not be framed.\n\nTopic: t"  # whole: not twice


def test_the_saved_view_groups_by_arm_and_charts_the_metric_first() -> None:
    envelope = json.loads(review_view.saved_view("eval/reward_mean", 1, 2))
    state = json.loads(envelope["state"])
    assert envelope["name"] == "By arm, eval/reward_mean first" and (envelope["createdAt"], envelope["updatedAt"]) == (1, 2)
    assert state["groupBy"]["groupByKeys"] == [{"mode": "tag", "groupByData": "arm"}]
    [chart] = state["compareRunCharts"]
    [section] = state["compareRunSections"]
    assert chart["metricKey"] == "eval/reward_mean" and chart["metricSectionId"] == section["uuid"]
    assert review_view.experiment_page("7", with_view=False) == "/experiments/7/runs?workflowType=machine_learning"
    assert (chart["xAxisKey"], chart["useGlobalXaxisKey"]) == ("step", True)


def test_a_verdict_judged_per_episode_is_charted_against_episodes_consumed_at_the_metric_s_own_steps() -> None:
    """MLflow pairs a chart's x and y by position in their histories: a held-out metric is charted against
    the episodes count the server logs beside each round (tests/integration/swarm_server/test_eval.py checks
    the steps and values), a training metric against the one logged every step."""
    def chart(metric: str) -> dict:
        [found] = json.loads(json.loads(review_view.saved_view(metric, 1, 2, "episode"))["state"])["compareRunCharts"]
        return dict(found)

    held_out, train = chart("eval/reward_mean"), chart("train/reward_mean")
    assert (held_out["xAxisKey"], held_out["selectedXAxisMetricKey"]) == ("metric", "eval/episodes_total")
    assert (train["xAxisKey"], train["selectedXAxisMetricKey"]) == ("metric", "train/episodes_total")
    assert held_out["useGlobalXaxisKey"] is False  # the chart's own x-axis, whatever the page's global one
    assert review_view.EPISODES_METRIC == TOTAL_EPISODES
    assert review_view.EVAL_EPISODES_METRIC == EVAL_EPISODES and TRAIN_EPISODES == TOTAL_EPISODES


def test_an_arm_is_named_by_its_configuration_so_iterations_pool_and_twins_stay_apart() -> None:
    """The ``arm`` tag pools runs as the verdict does (same settings = same arm, whatever the iteration):
    launch_runs names an arm by its plan's settings, the n-th same-settings arm of an iteration `` #n``."""
    plan = IterationPlan(experiments=[
        PlannedExperiment(name="it2-group-size-2", overrides={"lr": 0.001, "group_size": 2}),
        PlannedExperiment(name="it2-aa-1", overrides={"group_size": 8}),
        PlannedExperiment(name="it2-aa-2", overrides={"group_size": 8}),
        PlannedExperiment(name="it2-base"),
        PlannedExperiment(name="it2-client", overrides={"kl_coef": True}, factors={"tools": ["a", "b"]})])
    assert [_arm_tag(plan, e.name) for e in plan.experiments] == [
        "group_size=2, lr=0.001", "group_size=8", "group_size=8 #2", "defaults", 'kl_coef=true, tools=["a", "b"]']
    earlier = IterationPlan(experiments=[PlannedExperiment(name="it1-g2", overrides={"group_size": 2, "lr": 0.001}),
                                         PlannedExperiment(name="it1-aa-1", overrides={"group_size": 8}),
                                         PlannedExperiment(name="it1-aa-2", overrides={"group_size": 8})])
    assert [_arm_tag(earlier, e.name) for e in earlier.experiments] == [  # pooled with iteration 2's
        "group_size=2, lr=0.001", "group_size=8", "group_size=8 #2"]
    assert _arm_tag(plan, "not-planned") == "not-planned"


def test_ui_lists_each_study_s_link_to_its_saved_view_newest_first() -> None:
    def experiment(i: int, view: bool) -> SimpleNamespace:
        return SimpleNamespace(name=f"study-{i}", experiment_id=str(i), tags={review_view.VIEW_TAG: "{}"} if view else {})

    found = [experiment(9, True), experiment(8, False), *(experiment(i, True) for i in range(7, 0, -1))]
    lines = review_view.study_links("http://h:1", found, shown=2)
    assert lines[1:] == [f"  study-9: http://h:1/#{review_view.experiment_page('9', with_view=True)}",
                         f"  study-7: http://h:1/#{review_view.experiment_page('7', with_view=True)}",
                         "  … 6 more: researcher ui STUDY"]
    assert review_view.study_links("http://h:1", [experiment(8, False)]) == []  # no study yet: the list alone


CHROMIUM = Path("/usr/bin/chromium")  # Debian's; `apt-get install chromium`
VERDICT_METRIC = "eval/reward_mean"


def _two_arm_study(tracker: Tracker, study_id: str) -> tuple[str, list[str]]:
    """A finished two-arm study as the researcher records it: a parent run, two seeds an arm with the
    ``arm`` tag (its configuration) and per-step curves, the saved view and the description; (parent id,
    children ids)."""
    parent = tracker.start_parent(study_id, 1, {})
    children = []
    for letter, arm, slope in (("A", "it1-group-size-2", 0.02), ("B", "it1-group-size-8", 0.06)):
        for seed in (0, 1):
            run = tracker.start_child(study_id, parent, f"{letter} {arm} s{seed}", {"group_size": arm[-1], "seed": seed},
                                      {review_view.ARM_TAG: review_view.arm_label({"group_size": int(arm[-1])})})
            tracker.log_steps(run, [StepMetrics(step=s, policy_version=s, time=1000.0 + s, metrics={
                "train/reward_mean": slope * s + 0.01 * seed, "perf/tokens_per_s": 100.0 + s,
                **({VERDICT_METRIC: slope * s} if s % 4 == 0 else {})}) for s in range(9)])
            tracker.end(run)
            children.append(run)
    tracker.end(parent)
    tracker.save_review_view(study_id, VERDICT_METRIC)
    answer = ("Best group_size=8 (resolved against the runner-up) — area under the `eval/reward_mean` curve per "
              "training step over 8 steps: best group_size=8 0.240 ± 0.010, runner-up group_size=2 0.080 ± 0.010.")
    tracker.describe_study(study_id, write_report.description(
        "done", answer, "Topic: does a larger group learn faster?", tracker.report_markdown(study_id, parent, "report.md", [])))
    return parent, children


def _page_text(dom: str) -> str:
    """What a page says: its DOM without scripts, styles and tags, whitespace collapsed."""
    dom = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.DOTALL)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", dom)).split())


def test_the_ui_link_opens_the_runs_grouped_by_arm_with_the_verdict_metric_charted_first(cli, tmp_path: Path) -> None:
    """`researcher ui STUDY`'s link, in headless Chromium against the real MLflow UI it starts on a real
    SQLite store: the runs grouped by the ``arm`` tag, the verdict's metric charted first; a run opened
    from there (the description's link) stays in the training view."""
    assert CHROMIUM.exists(), f"Debian's Chromium is missing at {CHROMIUM}: .ci/setup installs it"
    sid = "review-study"
    artifacts = cli.artifacts.resolve()
    tracker = Tracker(f"sqlite:///{artifacts / 'mlflow.db'}", artifacts / "mlartifacts")
    parent, children = _two_arm_study(tracker, sid)
    experiment = tracker.client.get_experiment_by_name(sid)

    ui = subprocess.Popen(cli.argv("ui", sid, "--port", str(free_port()), "--artifacts-dir", str(artifacts)),
                          env=cli.env, cwd=cli.cwd, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        link = ui.stdout.readline().split()[3]
        root = link.split("/#/")[0]
        assert link == f"{root}/#{review_view.experiment_page(experiment.experiment_id, with_view=True)}"

        def healthy() -> bool:
            try:
                return httpx.get(f"{root}/health", timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(healthy, 90, what="the MLflow UI", interval=0.5)
        flags = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'chromium'}",
                 "--virtual-time-budget=60000", "--window-size=1400,1000", "--dump-dom"]

        def open_page(url: str) -> tuple[str, str]:
            dom = subprocess.run([*flags, url], check=False, capture_output=True, text=True, timeout=120).stdout
            return dom, _page_text(dom)

        dom, text = open_page(link)
        # Grouped by the arm tag, each arm's seeds under it.
        assert "Group by: arm" in text, text[:2000]
        assert "Group: group_size=2 2" in text and "Group: group_size=8 2" in text  # by configuration
        # The verdict's metric alone in the first chart section, drawn per arm; MLflow's own sections after it.
        first = text.index("The verdict's metric (1) Add chart")
        assert first < text.index("train (1) Add chart") and first < text.index("perf (1) Add chart")
        chart = text[first:text.index("perf (1) Add chart")]
        assert VERDICT_METRIC in chart and f"group_size=8 ({VERDICT_METRIC})" in chart and "Step" in chart
        # The answer's headline is the description's first line.
        assert "Answer (done): Best group_size=8 (resolved against the runner-up)" in text

        # The run links on that page: the description's (ours) opens the run in the training view; the runs
        # table's are MLflow's, which 3.17 writes without the view parameter (researcher.tracking.review_view).
        ours = re.search(rf'href="(#/experiments/{experiment.experiment_id}/runs/{parent}/[^"]*)"', dom)
        assert ours and review_view.TRAINING_VIEW in ours[1], dom[:2000]
        _, run_text = open_page(f"{root}/{html.unescape(ours[1])}")
        assert "iteration-1" in run_text and "Model training" in run_text and "Evaluation runs" not in run_text
        table = re.findall(rf'href="(#/experiments/{experiment.experiment_id}/runs/[0-9a-f]{{32}}[^"]*)"', dom)
        child = next(href for href in table if href.split("/runs/")[1][:32] in children)
        _, child_text = open_page(f"{root}/{html.unescape(child)}")
        assert "it1-group-size-" in child_text and "group_size" in child_text  # the run's own page
        if review_view.TRAINING_VIEW in child:  # a later MLflow carries the view into its run links
            assert "Evaluation runs" not in child_text
    finally:
        terminate(ui)  # its MLflow server and that server's children end with it

    # Without a study: the experiments list (a click there opens the browser's stored view, GenAI at first),
    # then each study's link to the page rendered above.
    listing = subprocess.Popen(cli.argv("ui", "--port", str(free_port()), "--artifacts-dir", str(artifacts)),
                               env=cli.env, cwd=cli.cwd, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        head = [listing.stdout.readline() for _ in range(3)]
    finally:
        terminate(listing)
    root = head[0].split()[3].split("/#/")[0]
    assert head[0].split()[3] == f"{root}/#{review_view.experiment_page(None, with_view=False)}", head
    assert head[2].split() == [f"{sid}:", f"{root}/#{review_view.experiment_page(experiment.experiment_id, True)}"]
