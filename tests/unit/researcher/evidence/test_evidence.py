"""Evidence from synthetic run dirs (real metrics.jsonl files, as the monitor writes them): verdicts
from the pooled 95% CI, seeds pooled across iterations, the noise floor, three axes, sweep curves,
and the held-out metric chosen when the runs hold it."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
from evidence_inputs import evidence, finished_trials, summarize

from researcher.evidence import analysis, plots
from researcher.findings import verdicts
from researcher.findings.records import Evidence, IterationPlan, IterationSummary
from researcher.planner import catalog
from researcher.planner.offline import OfflinePlanner
from researcher.runs import record as runs
from researcher.runs.launcher import Launcher
from researcher.session.context import StudyContext
from researcher.session.nodes import analyze, write_report
from researcher.study import budget
from researcher.study import files as studyfiles
from researcher.study.layout import StudyLayout
from researcher.tracking import review_view
from researcher.tracking.tracker import Tracker
from researcher.types.settings import ResearcherSettings, StudyOptions
from researcher.types.usage import new_usage
from swarm.protocol import StepMetrics

STEPS = 10
EXAMPLES = Path(__file__).resolve().parents[4] / "studies" / "examples"


def _write_run(run_dir: Path, rewards: list[float], episodes: int = 32, seconds: float = 2.0,
               evals: dict[int, float] | None = None) -> None:
    run_dir.mkdir(parents=True)
    items = []
    for i, reward in enumerate(rewards):
        metrics = {"train/reward_mean": reward, "train/episodes": float(episodes)}
        if evals and i + 1 in evals:
            metrics["eval/reward_mean"] = evals[i + 1]
        items.append(StepMetrics(step=i + 1, policy_version=i + 1, time=1_700_000_000 + i * seconds, metrics=metrics))
    runs.append_metrics(run_dir, items)


def _ramp(slope: float, noise: float, rng: random.Random, steps: int = STEPS) -> list[float]:
    """A learning curve rising by ``slope`` a step, shifted as a whole by a seed's noise."""
    shift = rng.gauss(0, noise)
    return [min(1.0, max(0.0, 0.1 + slope * s + shift + rng.gauss(0, noise / 3))) for s in range(steps)]


def _arm(tmp: Path, name: str, seeds: range, slope: float, noise: float, rng: random.Random, steps: int = STEPS,
         **run: object) -> list[dict]:
    trials = []
    for seed in seeds:
        run_dir = tmp / f"{name}-{seed}"
        _write_run(run_dir, _ramp(slope, noise, rng, steps), **run)  # type: ignore[arg-type]
        trials.append({"experiment": name, "seed": seed, "run_dir": str(run_dir), "status": "finished"})
    return trials


def _exp(name: str, **overrides: object) -> dict:
    return {"name": name, "overrides": overrides}


def test_an_a_a_pair_never_ends_yes(tmp_path: Path) -> None:
    rng = random.Random(7)
    experiments = [_exp("a", lr=1e-3), _exp("a-again", lr=1e-3)]  # identical configuration, different names
    trials = _arm(tmp_path, "a", range(4), 0.05, 0.03, rng) + _arm(tmp_path, "a-again", range(4), 0.05, 0.03, rng)
    summary = summarize(1, "lr", "train/reward_mean", STEPS, experiments, trials, 0.02, None)
    study = summary.study
    assert [len(r.aucs) for r in study.arms] == [4, 4]  # the twins stay two arms
    answer, caveats = verdicts.verdict("q", [summary])
    assert answer.startswith(("No meaningful difference", "Inconclusive")), answer
    noise = study.noise_floor["step"]
    assert noise.seeds == 8 and 0 < noise.sd < 0.1
    assert f"Noise floor (pooled within-configuration sd of the AUC per training step): {noise.sd:.4f}" in caveats
    if answer.startswith("Inconclusive"):
        assert "seeds per arm would resolve it" in answer and "estimated with Student t" in answer


def test_a_large_effect_ends_yes_or_no_with_the_right_direction(tmp_path: Path) -> None:
    rng = random.Random(1)
    experiments = [_exp("slow", lr=3e-5), _exp("fast", lr=3e-3)]
    trials = _arm(tmp_path, "slow", range(3), 0.005, 0.02, rng) + _arm(tmp_path, "fast", range(3), 0.08, 0.02, rng)
    summary = summarize(1, "lr", "train/reward_mean", STEPS, experiments, trials, 0.02, None)
    answer, caveats = verdicts.verdict("q", [summary])
    assert answer.startswith("Yes: the larger lr (0.003) learned faster per training step"), answer
    assert summary.comparison.clear and summary.best_value == 3e-3
    assert "Verdicts use `train/reward_mean`" in caveats and "One iteration ran" in caveats
    # The same runs with the arms' values swapped: the larger value is now the slower one.
    swapped = [_exp("slow", lr=3e-3), _exp("fast", lr=3e-5)]
    answer, _ = verdicts.verdict("q", [summarize(1, "lr", "train/reward_mean", STEPS, swapped, trials, 0.02,
                                                          None)])
    assert answer.startswith("No: the larger lr (0.003) learned slower per training step"), answer


def test_a_claim_judged_on_entropy_is_answered_in_its_metric_not_in_learning_speed(tmp_path: Path) -> None:
    """Clip-higher is judged on `train/entropy`: its Answer says which arm kept entropy higher (nothing
    "learned faster"), and its evidence names the final entropy, not a final reward."""
    height = {"wide": 5.2, "narrow": 4.6}
    trials = finished_trials(tmp_path, ["wide", "narrow"], 3, STEPS, lambda name, seed, step: {
        "train/entropy": height[name] - 0.05 * step + 0.01 * seed, "train/reward_mean": 0.3, "train/episodes": 32.0})
    experiments = [_exp("wide", clip_ratio_high=0.28), _exp("narrow", clip_ratio_high=0.2)]
    answer, _ = verdicts.verdict("q", [summarize(1, "clip_ratio_high", "train/entropy", STEPS, experiments, trials,
                                                 0.02, None)])
    assert answer.startswith("Yes: the larger clip_ratio_high (0.28) kept `train/entropy` higher per training step")
    assert "final `train/entropy`" in answer and "learned" not in answer and "final reward" not in answer


def test_a_replicate_iteration_pools_seeds_and_resolves_the_pair(tmp_path: Path) -> None:
    rng = random.Random(3)
    first = [_exp("it1-lr-1e-3", lr=1e-3), _exp("it1-lr-3e-3", lr=3e-3)]
    trials1 = (_arm(tmp_path, "it1-lr-1e-3", range(2), 0.04, 0.05, rng)
               + _arm(tmp_path, "it1-lr-3e-3", range(2), 0.055, 0.05, rng))
    s1 = summarize(1, "lr", "train/reward_mean", STEPS, first, trials1, 0.01, None)
    answer1, _ = verdicts.verdict("q", [s1])
    assert answer1.startswith("Inconclusive") and "seeds per arm would resolve it" in answer1, answer1
    assert s1.comparison.seeds == 2 and s1.comparison.seeds_needed > 2
    # The offline planner reads this summary (as plan_experiments hands it over) and re-runs the same pair.
    planner = OfflinePlanner(sorted(catalog.examples(EXAMPLES)))
    topic = "Does lr 1e-3 beat lr 3e-3 on letters?"
    framing = planner.frame(topic, "").value
    history = [{**s1.model_dump(include={"iteration", "best", "best_value", "comparison", "plateau"}),
                "values": {e.name: e.value for e in s1.experiments}}]
    plan = planner.plan(framing, {"topic": topic, "iteration": 2, "history": history, "min_effect": 0.01,
                                  "best_value": s1.best_value, "tested_values": [1e-3, 3e-3]}).value
    assert plan.stage == "replicate" and sorted(e.overrides["lr"] for e in plan.experiments) == [1e-3, 3e-3]
    second = [_exp("it2-lr-3e-3", lr=3e-3), _exp("it2-lr-1e-3", lr=1e-3)]  # the replicate iteration's arms
    trials2 = (_arm(tmp_path, "it2-lr-1e-3", range(10, 20), 0.04, 0.05, rng)
               + _arm(tmp_path, "it2-lr-3e-3", range(10, 20), 0.055, 0.05, rng))
    earlier = [{**t, "iteration": 1, "overrides": next(e["overrides"] for e in first if e["name"] == t["experiment"])}
               for t in trials1]
    s2 = summarize(2, "lr", "train/reward_mean", STEPS, second, trials2, 0.01, None, earlier)
    study = s2.study
    assert sorted(len(r.aucs) for r in study.arms) == [12, 12]
    assert {r.name for r in study.arms} == {"it2-lr-3e-3", "it2-lr-1e-3"}  # named after the latest run
    assert [r.iterations for r in study.arms] == [[1, 2], [1, 2]]
    assert s2.comparison.clear and s2.comparison.seeds == 12
    answer, caveats = verdicts.verdict("q", [s1, s2])
    assert answer.startswith("Yes: the larger lr (0.003)"), answer
    assert "How refinement changed the picture: iteration 1 alone had" in caveats
    assert "pooling 24 usable runs over 2 iterations" in caveats


def test_a_sweep_gives_a_curve_with_the_best_value_and_its_interval(tmp_path: Path) -> None:
    rng = random.Random(5)
    slopes = {0.0: 0.03, 0.01: 0.06, 0.05: 0.09, 0.2: 0.05, 0.5: 0.02}  # peaks at kl_coef = 0.05
    experiments = [_exp(f"kl-{v}", kl_coef=v) for v in slopes]
    trials = [t for v, slope in slopes.items() for t in _arm(tmp_path, f"kl-{v}", range(3), slope, 0.01, rng)]
    summary = summarize(1, "kl_coef", "train/reward_mean", STEPS, experiments, trials, 0.02, None,
                                 shape="sweep")
    study = summary.study
    assert study.sweep and study.best_value == 0.05 and study.comparison.worse_value == 0.01
    answer, _ = verdicts.verdict("q", [summary])
    assert answer.startswith("Best kl_coef=0.05 (resolved against the runner-up)"), answer
    png = plots.dose_response(study, tmp_path / "figures" / "dose-response.png", "sweep")
    assert png.stat().st_size > 1000
    study.plots = {"curve": "figures/dose-response.png"}
    text = "\n".join(write_report.evidence_section(study))
    best = next(r for r in study.arms if r.value == 0.05).axes["step"]
    assert f"best kl_coef=0.05 with AUC {best.mean:.3f} ± {best.hw:.3f}, resolved against the runner-up" in text
    table = [line for line in text.splitlines() if line.startswith("| 0") and line.count("|") == 4]
    assert [line.split(" | ")[0] for line in table] == ["| 0.0", "| 0.01", "| 0.05", "| 0.2", "| 0.5"]
    assert "![dose-response curve of kl_coef](figures/dose-response.png)" in text


def test_axes_disagreeing_is_stated_and_group_size_is_judged_per_episode(tmp_path: Path) -> None:
    rng = random.Random(11)
    experiments = [_exp("g2", group_size=2), _exp("g8", group_size=8)]
    # The larger group rises faster per step but consumes 4x the episodes a step, and runs slower; 20
    # steps give it 5 points inside the 160 episodes the smaller group reached.
    trials = (_arm(tmp_path, "g2", range(3), 0.02, 0.01, rng, steps=20, episodes=8, seconds=1.0)
              + _arm(tmp_path, "g8", range(3), 0.035, 0.01, rng, steps=20, episodes=32, seconds=3.0))
    summary = summarize(1, "group_size", "train/reward_mean", 20, experiments, trials, 0.02, None)
    study = summary.study
    assert study.axis == "episode" and study.budgets["episode"] == 160 and study.budgets["second"] == 19
    assert not study.switch and {r.rounds["episode"] for r in study.arms} == {5, 20}
    compared = study.axes_compared
    # Every axis compares the verdict axis' leader (group_size=2) minus the runner-up (group_size=8).
    assert compared["episode"].better_value == 2 and compared["episode"].clear
    assert compared["step"].diff + compared["step"].hw < 0  # per step, group_size=8 is clearly ahead
    answer, caveats = verdicts.verdict("q", [IterationSummary.model_validate(summary.without_runs().dump())])
    assert answer.startswith("No: the larger group_size (8) learned slower per episode consumed"), answer
    # Its higher final reward is no contradiction, and the Answer says why in one clause.
    assert ("; group_size=8 ends with the higher final reward" in answer and "because the final reward is read after "
            "each run's own 20 steps, by which group_size=8 had used 640 episodes against 160, while the verdict "
            "compares both over the first 160 episodes" in answer), answer
    assert "The axes disagree: per training step group_size=8 leads" in caveats
    assert "per episode consumed group_size=2 leads" in caveats and "a larger group sees more samples" in caveats
    values = analyze.mlflow_values(study)
    assert {"analysis/noise_floor/step", "analysis/noise_floor/episode", "analysis/noise_floor/second",
            "analysis/noise_floor_seeds/episode", "analysis/auc_episode/g2", "analysis/auc_second/g8",
            "analysis/auc_step/g8", "analysis/min_effect"} <= set(values)
    assert values["analysis/noise_floor_seeds/episode"] == 6
    text = "\n".join(write_report.evidence_section(study))
    assert "AUC per episode consumed (verdict)" in text and "Noise floor per wall-clock second" in text


def test_held_out_evaluation_is_used_when_every_run_holds_it(tmp_path: Path) -> None:
    experiments = [_exp("low", lr=1e-4), _exp("high", lr=1e-3)]
    trials = []
    for name, level in (("low", 0.2), ("high", 0.6)):
        for seed in range(3):
            run_dir = tmp_path / f"{name}-{seed}"
            # Training reward says the opposite of the held-out evaluation (every 2nd step: 5 rounds).
            _write_run(run_dir, [0.8 - level + 0.01 * seed] * STEPS,
                       evals={s: level + 0.01 * seed + 0.01 * s for s in (2, 4, 6, 8, 10)})
            trials.append({"experiment": name, "seed": seed, "run_dir": str(run_dir), "status": "finished"})
    summary = summarize(1, "lr", "train/reward_mean", STEPS, experiments, trials, 0.02, None)
    assert summary.metric == "eval/reward_mean" and summary.best == "high"
    answer, caveats = verdicts.verdict("q", [summary])
    assert answer.startswith("Yes: the larger lr (0.001)") and "`eval/reward_mean`" in answer
    assert "Verdicts use `eval/reward_mean` (held-out evaluation" in caveats
    # One run without the held-out metric: the verdict falls back to the training reward, and says so.
    (Path(trials[0]["run_dir"]) / runs.METRICS_FILE).unlink()
    _write_run_dir = Path(trials[0]["run_dir"])
    _write_run_dir.rmdir()
    _write_run(_write_run_dir, [0.6] * STEPS)
    fallback = summarize(1, "lr", "train/reward_mean", STEPS, experiments, trials, 0.02, None)
    assert fallback.metric == "train/reward_mean"
    assert "not every run holds a held-out `eval/reward_mean`" in verdicts.verdict("q", [fallback])[1]
    # Registered on the held-out reward (as the offline planner registers it): the switch opens the Answer.
    switched = summarize(1, "lr", "eval/reward_mean", STEPS, experiments, trials, 0.02, None)
    answer, _ = verdicts.verdict("q", [switched])
    assert switched.metric == "train/reward_mean" and switched.study.registered_metric == "eval/reward_mean"
    assert answer.startswith("Judged on `train/reward_mean`, not the registered `eval/reward_mean`: not every run "
                             "holds a held-out `eval/reward_mean` (1 of 6 runs have fewer than 2 evaluation "
                             "rounds). "), answer


def test_read_axes_counts_episodes_and_seconds_from_the_first_step(tmp_path: Path) -> None:
    _write_run(tmp_path / "r", [0.1, 0.2, 0.3], episodes=16, seconds=2.5)
    curve = analysis.read_axes(tmp_path / "r", "train/reward_mean")
    assert curve.steps == [1, 2, 3] and curve.episodes == [16, 32, 48]
    assert curve.seconds == pytest.approx([0.0, 2.5, 5.0]) and curve.values == [0.1, 0.2, 0.3]
    # Held-out results arrive with a later step and name the policy they evaluated (eval/step); a step
    # written twice (a crash between writes) merges.
    lines = [(1, {"train/reward_mean": 0.1, "train/episodes": 8}),
             (2, {"train/reward_mean": 0.2, "train/episodes": 8, "eval/reward_mean": 0.05, "eval/step": 0}),
             (2, {"train/reward_mean": 0.2, "train/episodes": 8}),
             (3, {"train/reward_mean": 0.3, "train/episodes": 8, "eval/reward_mean": 0.4, "eval/step": 2})]
    (tmp_path / "e").mkdir()
    runs.append_metrics(tmp_path / "e", [StepMetrics(step=s, policy_version=s, time=100.0 + s, metrics=m)
                                         for s, m in lines])
    held_out = analysis.read_axes(tmp_path / "e", "eval/reward_mean")
    assert held_out == analysis.Curve([0, 2], [0.0, 16.0], [0.0, 1.0], [0.05, 0.4], [0.0, 0.0])
    assert analysis.read_axes(tmp_path / "e", "train/reward_mean").episodes == [8, 16, 24]


def test_analyze_and_report_carry_the_pooled_evidence_to_disk_and_mlflow(tmp_path: Path) -> None:
    """The nodes on a real study layout and a real MLflow SQLite store: iteration 2 (a replicate) pools
    iteration 1's runs from disk; report.md and the iteration's parent run carry the three axes and the
    noise floor."""
    settings = ResearcherSettings(studies_root=tmp_path / "studies", artifacts_root=tmp_path / "artifacts",
                                  examples_root=EXAMPLES, prompts_root=EXAMPLES.parents[1] / "prompts")
    layout = StudyLayout("pooled", settings.studies_root, settings.artifacts_root)
    layout.ensure()
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "art")
    events: list[tuple[str, dict]] = []
    ctx = StudyContext(settings, layout, OfflinePlanner(["letters"]), tracker, Launcher(settings.swarm_command),
                       emit=lambda event, data: events.append((event, data)))
    framing = {"answerable": True, "reason": "named", "question": "group size 2 vs 8", "task": "letters",
               "knob": "group_size", "metric": "train/reward_mean"}
    rng = random.Random(2)
    steps = 20  # group_size=8 has 5 points in the 160 episodes group_size=2 reaches: judged per episode
    trials: dict[int, list[dict]] = {}
    for iteration in (1, 2):
        experiments = [_exp(f"it{iteration}-g2", group_size=2), _exp(f"it{iteration}-g8", group_size=8)]
        studyfiles.write_plan(layout, iteration, IterationPlan.model_validate(
            {"experiments": experiments, "hypotheses": [], "steps_per_run": steps, "shape": "comparison",
             "stage": "initial"}), framing)
        trials[iteration] = []
        for index, (exp, seed) in enumerate((e, s) for e in experiments for s in range(3)):
            run_dir = layout.run_dir(iteration, index)
            group = exp["overrides"]["group_size"]
            _write_run(run_dir, _ramp(0.015 if group == 2 else 0.03, 0.01, rng, steps), episodes=4 * group)
            runs.save(run_dir, runs.RunRecord(key=f"pooled/{iteration}/{index}", study_id="pooled", iteration=iteration,
                                              trial=index, experiment=exp["name"], seed=seed, config={}, client="c.py",
                                              target_step=steps, episodes=64, group_size=group, status="finished",
                                              last_step=steps, launches=1))
            trials[iteration].append({"experiment": exp["name"], "seed": seed, "run_dir": str(run_dir),
                                      "status": "finished"})
    parent = tracker.start_parent("pooled", 2, {})
    now = time.time()
    state = {"study_id": "pooled", "topic": "Does group size 8 beat 2 on letters?", "framing": framing,
             "iteration": 2, "trials": trials[2], "options": StudyOptions(seeds=3, max_runs=12).model_dump(),
             "iterations": [], "mlflow_parent_run": parent, "llm": new_usage(),
             "budget": budget.make_budget(now, now + 3600, max_runs=12, max_iterations=3, max_repairs=3,
                                          max_llm_tokens=0, max_llm_cost_usd=0.0)}
    out = analyze.analyze(state, ctx)  # type: ignore[arg-type]
    study = IterationSummary.model_validate(out["iterations"][-1]).study
    assert sorted(len(r.aucs) for r in study.arms) == [6, 6] and study.noise_floor["episode"].seeds == 12
    # The progress lines are the whole study's on the verdict's axis and metric; the first is the "best" shown.
    shown = next(data for event, data in events if event == "analyzed")
    best = next(r for r in study.arms if r.name == shown["best"])
    assert shown["lines"][0].startswith(f"{shown['best']} (group_size={best.value}): AUC per episode consumed of "
                                        f"`train/reward_mean` {best.axes['episode'].mean:.3f} ± ")
    assert "(6/6 runs usable, iteration(s) 1, 2)" in shown["lines"][0]
    axes_png = (layout.study_dir / "figures" / "axes.png").read_bytes()
    assert len(axes_png) > 1000
    assert int.from_bytes(axes_png[16:20], "big") <= plots.PAGE_PX  # PNG width: MLflow shows it at that size

    run = tracker.client.get_run(parent)
    tags = run.data.tags
    # The evidence is one table artifact, not a one-point metric per number (MLflow charted each).
    assert not any(k.startswith("analysis/") for k in run.data.metrics)
    table = json.loads(Path(tracker.client.download_artifacts(parent, "analysis/evidence.json", str(tmp_path))).read_text())
    rows = {(r[0], r[1]): r[2] for r in table["data"]}
    assert table["columns"] == ["quantity", "subject", "value"]
    assert rows[("noise_floor_seeds", "episode")] == 12 and rows[("min_effect", "")] == 0.02
    for axis in ("step", "episode", "second"):  # per token only where a knob offers it
        assert ("noise_floor", axis) in rows and (f"auc_{axis}", "it2-g8") in rows
    assert tags["researcher.primary_axis"] == "episode" and tags["researcher.metric"] == "train/reward_mean"
    # A "best" only where the evidence resolved one; the leader is named either way.
    assert tags["researcher.leader"] == study.best
    assert tags["researcher.best"] == (study.best if study.comparison.clear else
                                       f"none ({tags['researcher.evidence']})")
    listed = {f.path for f in tracker.client.list_artifacts(parent, "figures")}
    assert "figures/axes.png" in listed

    write_report.write({**state, **out}, ctx)  # type: ignore[arg-type]
    report = layout.report_md.read_text()
    assert "## Answer" in report and "## Evidence (whole study)" in report and "pooled over iterations 1, 2" in report
    assert "AUC per episode consumed (verdict)" in report and "| AUC per wall-clock second |" in report
    assert "Noise floor per training step (pooled within-configuration sd of the AUC):" in report
    assert "from 12 seeds in 2 configurations" in report and "figures/axes.png" in report
    # MLflow: the description's first line is the answer's headline, whole below; the saved view charts
    # the judged metric first and is linked from the description.
    experiment = tracker.client.get_experiment_by_name("pooled")
    description = experiment.tags["mlflow.note.content"]
    first = description.split("\n\n", 1)[0]
    assert first.startswith("Answer (done): ") and len(first) <= write_report.HEADLINE_CHARS
    assert " ".join(report.split("## Answer\n\n", 1)[1].split("\n", 1)[0].split()) in description
    view = json.loads(json.loads(experiment.tags[review_view.VIEW_TAG])["state"])
    assert view["compareRunCharts"][0]["metricKey"] == study.metric == "train/reward_mean"
    assert f"viewStateShareKey={review_view.VIEW_ID}" in description
    review = (layout.study_dir / "review.md").read_text()
    assert "AUC/episode" in review and "AUC/second" in review


def test_twins_are_named_in_the_verdict_and_never_make_a_plateau(tmp_path: Path) -> None:
    rng = random.Random(9)
    first = [_exp("it1-a", lr=1e-3), _exp("it1-a-copy", lr=1e-3)]
    # Identical configurations whose runs differ anyway (a false positive, or a difference outside the config).
    trials1 = (_arm(tmp_path, "it1-a", range(3), 0.08, 0.005, rng)
               + _arm(tmp_path, "it1-a-copy", range(3), 0.03, 0.005, rng))
    s1 = summarize(1, "lr", "train/reward_mean", STEPS, first, trials1, 0.02, None)
    answer, _ = verdicts.verdict("q", [s1])
    assert answer.startswith("Yes: it1-a learned faster than it1-a-copy per training step, though both run the "
                             "identical configuration (lr=0.001)"), answer
    assert "larger" not in answer
    # A replicate iteration: the twins pool with their namesakes, and twins are never a "plateau" of the knob.
    second = [_exp("it2-a", lr=1e-3), _exp("it2-a-copy", lr=1e-3)]
    trials2 = (_arm(tmp_path, "it2-a", range(10, 13), 0.05, 0.002, rng)
               + _arm(tmp_path, "it2-a-copy", range(10, 13), 0.05, 0.002, rng))
    earlier = [{**t, "iteration": 1, "overrides": {"lr": 1e-3}} for t in trials1]
    s2 = summarize(2, "lr", "train/reward_mean", STEPS, second, trials2, 0.02,
                            {"name": "it1-a", "value": 1e-3}, earlier)
    assert [(r.name, len(r.aucs)) for r in s2.study.arms] == [("it2-a", 6), ("it2-a-copy", 6)]
    assert s2.plateau is None


def _held_out_run(run_dir: Path, evals: dict[int, float]) -> None:
    """A run whose held-out results name the step they evaluated (``eval/step``), one step later."""
    run_dir.mkdir(parents=True)
    items = [StepMetrics(step=s, policy_version=s, time=1_700_000_000.0 + s,
                         metrics={"train/reward_mean": 0.1, "train/episodes": 32.0,
                                  **({"eval/reward_mean": evals[s - 1], "eval/step": float(s - 1)} if s - 1 in evals
                                     else {})}) for s in range(1, max(evals) + 2)]
    runs.append_metrics(run_dir, items)


def test_runs_evaluated_at_different_steps_compare_over_the_same_steps(tmp_path: Path) -> None:
    """Held-out evaluation lands on different steps in different runs; a run with no point at the shared
    horizon is interpolated there, not cut back to its untrained step-0 value."""
    trials = []
    pairs = [({0: 0.01, 6: 0.05}, {0: 0.01, 7: 0.09}), ({0: 0.01, 6: 0.06}, {0: 0.01, 7: 0.1})]
    for seed, (early, late) in enumerate(pairs):
        for name, evals in (("early", early), ("late", late)):
            _held_out_run(tmp_path / f"{name}-{seed}", evals)
            trials.append({"experiment": name, "seed": seed, "run_dir": str(tmp_path / f"{name}-{seed}"),
                           "status": "finished"})
    for t in trials:
        t["overrides"] = {"lr": 1e-4 if t["experiment"] == "early" else 1e-3}
    study = evidence("lr", "eval/reward_mean", STEPS, trials, 0.02)
    assert study.metric == "eval/reward_mean" and study.horizon == 6
    late = next(r for r in study.arms if r.name == "late")
    # Step 6 of 0.01 -> 0.09 over steps 0..7 is 0.0786; of 0.01 -> 0.1 it is 0.0871: mean heights over 0..6.
    assert late.aucs == pytest.approx([(0.01 + 0.01 + 0.08 * 6 / 7) / 2, (0.01 + 0.01 + 0.09 * 6 / 7) / 2])
    assert study.best == "late"
    # Two held-out rounds per run: scored, but never a verdict (summarize then judges the training reward).
    assert study.short.startswith("No verdict per training step: within the 6 steps every run reached, ")


def test_a_study_from_before_pooled_evidence_is_answered_from_its_runs_on_disk(tmp_path: Path) -> None:
    """A state written before pooled evidence existed: its iteration summaries have no "study", which
    used to read "No answer". The report recomputes the evidence from the runs on disk."""
    settings = ResearcherSettings(studies_root=tmp_path / "studies", artifacts_root=tmp_path / "artifacts",
                                  examples_root=EXAMPLES, prompts_root=EXAMPLES.parents[1] / "prompts")
    layout = StudyLayout("old", settings.studies_root, settings.artifacts_root)
    layout.ensure()
    ctx = StudyContext(settings, layout, OfflinePlanner(["letters"]),
                       Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "art"),
                       Launcher(settings.swarm_command))
    rng = random.Random(4)
    history = []
    for iteration in (1, 2):
        slopes = {f"it{iteration}-lr-3e-4": (3e-4, 0.02), f"it{iteration}-lr-3e-3": (3e-3, 0.08)}
        for index, (name, seed) in enumerate((n, s) for n in slopes for s in range(3)):
            run_dir = layout.run_dir(iteration, index)
            _write_run(run_dir, _ramp(slopes[name][1], 0.01, rng))
            runs.save(run_dir, runs.RunRecord(key=f"old/{iteration}/{index}", study_id="old", iteration=iteration,
                                              trial=index, experiment=name, seed=seed, config={}, client="c.py",
                                              target_step=STEPS, episodes=64, group_size=8, status="finished",
                                              last_step=STEPS, launches=1))
        # The summary as analysis wrote it then: this iteration's table, no pooled "study".
        history.append({"iteration": iteration, "knob": "lr", "metric": "train/reward_mean", "horizon": STEPS,
                        "experiments": [{"name": n, "value": v, "overrides": {"lr": v}, "statuses": ["finished"] * 3,
                                         "aucs": [0.3] * 3, "finals": [0.4] * 3,
                                         "auc": {"mean": 0.3, "hw": 0.0, "n": 3},
                                         "final": {"mean": 0.4, "hw": 0.0, "n": 3}} for n, (v, _) in slopes.items()],
                        "best": f"it{iteration}-lr-3e-3", "best_value": 3e-3, "plateau": None,
                        "comparison": {"better": f"it{iteration}-lr-3e-3", "worse": f"it{iteration}-lr-3e-4",
                                       "diff": 0.2, "hw": 0.05, "clear": True}})
    # what such a state read as before:
    assert verdicts.verdict("q", IterationSummary.load_all(history))[0].startswith("No answer")
    now = time.time()
    state = {"study_id": "old", "topic": "Does lr 3e-3 beat 3e-4 on letters?", "iteration": 2, "phase": "reporting",
             "framing": {"answerable": True, "reason": "named", "question": "lr 3e-3 vs 3e-4", "task": "letters",
                         "knob": "lr", "metric": "train/reward_mean"},
             "iterations": history, "options": StudyOptions(seeds=3, max_runs=12).model_dump(), "llm": new_usage(),
             "budget": budget.make_budget(now, now + 3600, max_runs=12, max_iterations=3, max_repairs=3,
                                          max_llm_tokens=0, max_llm_cost_usd=0.0)}
    write_report.write(state, ctx)  # type: ignore[arg-type]
    report = layout.report_md.read_text()
    answer = report.split("## Answer\n\n", 1)[1].split("\n", 1)[0]
    assert answer.startswith("Yes: the larger lr (0.003) learned faster per training step"), answer
    assert "seeds lr=0.003: 6, lr=0.0003: 6" in answer  # both iterations' runs, pooled
    assert "## Evidence (whole study)" in report and "pooled over iterations 1, 2" in report


def test_the_question_states_the_verdict_axis_and_the_answer_names_both_when_they_differ() -> None:
    """An LLM's question may say nothing of the axis, or another one: frame_topic makes it state the
    knob's verdict axis, and an answer judged on another axis than the question's says so first."""
    llm = "Does a larger GRPO group size make the letters task learn faster?"
    asked = verdicts.question_with_axis(llm, "group_size")
    assert asked == "Does a larger GRPO group size make the letters task learn faster, judged per episode consumed?"
    assert verdicts.question_with_axis(asked, "group_size") == asked  # already stated: unchanged
    assert verdicts.question_with_axis("Does lr 1e-3 beat 1e-4?", "lr").endswith(", judged per training step?")
    other = verdicts.question_with_axis("Does a larger group size make letters learn faster per step?", "group_size")
    assert other.startswith("Does a larger group size make letters learn faster per step? (The verdict is judged per "
                            "episode consumed, not per training step: ")  # the scripted LLM planner's question

    study = Evidence(knob="group_size", metric="train/reward_mean", axis="episode",
                     axis_why="judged per episode consumed, not per training step: …")
    answer = "No meaningful difference: the whole 95% CI lies within ±0.02."
    assert verdicts.answer_naming_axes(asked, study, answer) == answer
    per_step = "Does a larger group size learn faster, measured as the area under the reward curve per training step?"
    named = verdicts.answer_naming_axes(per_step, study, answer)
    first = named.split(". ")[0]
    assert "per episode consumed" in first and "per training step" in first and named.endswith(answer)
    assert verdicts.answer_naming_axes(other, study, answer) == answer  # the question states the verdict's axis


def _evaluated_run(run_dir: Path, steps: int, episodes: float, level: float, slope: float) -> None:
    """A run as the letters study writes it: a training reward every step and a held-out round every 5
    steps (step 0, the untrained policy, included), each merged into the row after the step it evaluated."""
    run_dir.mkdir(parents=True)
    rounds = {s: level + slope * s for s in range(0, steps + 1, 5)}
    runs.append_metrics(run_dir, [StepMetrics(
        step=s, policy_version=s, time=1_700_000_000.0 + s,
        metrics={"train/reward_mean": level + slope * s, "train/episodes": episodes,
                 **({"eval/reward_mean": rounds[s - 1], "eval/step": float(s - 1)} if s - 1 in rounds else {})})
        for s in range(1, steps + 2)])


def test_an_arm_with_two_rounds_in_the_episode_window_moves_the_verdict_to_the_axis_with_the_evidence(
        tmp_path: Path) -> None:
    """The README study's shape: group_size=2 (8 episodes a step) against 8 (32 a step), 30 steps, a held-out
    round every 5. Within the 240 episodes group_size=2 reached, group_size=8 was evaluated at steps 0 and 5
    only: no verdict per episode from two points. The Answer opens with the switch to per training step
    (where every arm has 7 rounds) and the registered per-episode result stays in the report."""
    experiments = [_exp("g2", group_size=2), _exp("g8", group_size=8)]
    trials = []
    for name, episodes, slope in (("g2", 8.0, 0.004), ("g8", 32.0, 0.012)):
        for seed in range(3):
            run_dir = tmp_path / f"{name}-{seed}"
            _evaluated_run(run_dir, 30, episodes, 0.05 + 0.005 * seed, slope + 0.0005 * seed)
            trials.append({"experiment": name, "seed": seed, "run_dir": str(run_dir), "status": "finished"})
    # As the state stores it and the report reads it back: every number the wording needs survives.
    summary = IterationSummary.model_validate(
        summarize(1, "group_size", "eval/reward_mean", 30, experiments, trials, 0.02, None).without_runs().dump())
    study = summary.study
    assert summary.metric == "eval/reward_mean" and study.registered_axis == "episode" and study.axis == "step"
    assert {r.name: r.rounds for r in study.arms} == {"g2": {"step": 7, "episode": 7, "second": 7},
                                                      "g8": {"step": 7, "episode": 2, "second": 7}}
    switch = ("Judged per training step, not per episode consumed as registered: within the 240 episodes every run "
              "reached, group_size=8 has only 2 held-out evaluation rounds (at least 4 needed); per training step "
              "every arm has at least 7.")
    assert study.switch == switch
    answer, _ = verdicts.verdict("Does a larger group size make letters learn faster, judged per episode consumed?",
                                 [summary])
    assert answer.startswith(f"{switch} Yes: the larger group_size (8) learned faster per training step"), answer
    assert verdicts.answer_class(answer) is verdicts.Verdict.YES
    # Whoever words it, the switch stays the Answer's first sentence (and is not doubled).
    assert verdicts.answer_naming_axes("… judged per episode consumed?", study, answer) == answer
    assert verdicts.answer_naming_axes("… judged per episode consumed?", study, "Yes: …") == f"{switch} Yes: …"
    text = "\n".join(write_report.evidence_section(study))
    assert "AUC per training step (verdict)" in text and switch in text
    assert ("- per episode consumed: " in text and "the registered axis, not judged: the thinnest arm has 2 held-out "
            "evaluation rounds in its window" in text), text


def test_a_late_riser_with_the_higher_final_reward_is_explained_in_the_answer(tmp_path: Path) -> None:
    """Per step, the arm ahead on the area can end below the other: the Answer says why in one clause."""
    experiments = [_exp("early", lr=1e-3), _exp("late", lr=1e-4)]
    trials = []
    for name, curve in (("early", [0.1, 0.5, 0.55, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6]),
                        ("late", [0.0, 0.0, 0.0, 0.05, 0.1, 0.6, 0.8, 0.9, 0.95, 0.95])):
        for seed in range(3):
            run_dir = tmp_path / f"{name}-{seed}"
            _write_run(run_dir, [v + 0.01 * seed for v in curve])
            trials.append({"experiment": name, "seed": seed, "run_dir": str(run_dir), "status": "finished"})
    summary = summarize(1, "lr", "train/reward_mean", STEPS, experiments, trials, 0.02, None)
    answer, _ = verdicts.verdict("q", [summary])
    assert answer.startswith("Yes: the larger lr (0.001) learned faster per training step; lr=0.0001 ends with the "
                             "higher final reward (0.850 vs 0.610) because"), answer
    assert ("; lr=0.0001 ends with the higher final reward" in answer and "because the verdict weighs each whole "
            "curve over 10 steps and lr=0.0001 rose later, while the final reward is the mean of the last 5 points"
            in answer), answer
