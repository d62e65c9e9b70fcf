"""Turn runs into evidence: per configuration, mean ± 95% CI of the area under the reward curve on
three axes (per training step, per episode consumed, per wall-clock second) and of the final reward;
the noise floor; and the comparison of the best configuration with the runner-up.

Seeds of the same configuration (same overrides) are pooled across iterations, so the seeds a
replicate iteration adds narrow the interval of the comparison it re-ran, and the answer reads the
whole study. Verdicts use ``eval/reward_mean`` (held-out evaluation) when every run holds it, else
``train/reward_mean``. Results are small dicts (they go into the graph state and analysis.json);
curves are read from each run's metrics.jsonl; ``researcher.verdicts`` words the answer from them.
``backfill`` gives summaries written before pooled evidence existed their ``study``, from the runs on disk.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from researcher import runs, stats
from researcher.layout import StudyLayout

OK_STATUSES = ("finished", "cut")  # runs whose curve counts as evidence (cut = ended by the deadline)
MIN_POINTS = 3
MIN_EVAL_POINTS = 2  # held-out evaluation runs every few steps: fewer points per run
TRAIN_METRIC, EVAL_METRIC = "train/reward_mean", "eval/reward_mean"
AXES = ("step", "episode", "second")
AXIS_TEXT = {"step": "per training step", "episode": "per episode consumed", "second": "per wall-clock second"}
AXIS_UNIT = {"step": "steps", "episode": "episodes", "second": "s"}
SWEEP_MIN = 4  # a curve needs at least this many values
# Knobs that change how many episodes a training step consumes: judged per episode, since per step the
# larger setting trivially sees more samples.
_PER_EPISODE = {"group_size": "a larger group sees more samples per training step",
                "batch_groups": "a larger batch sees more samples per training step"}


def primary_axis(knob: str) -> tuple[str, str]:
    """The axis a knob's verdict is judged on, and why (wall-clock is never primary: runs share 2 CPU
    cores, so seconds measure contention as much as learning)."""
    if knob in _PER_EPISODE:
        return "episode", f"judged per episode consumed, not per training step: {_PER_EPISODE[knob]}"
    return "step", ("judged per training step (every configuration trains on the same number of episodes per "
                    "step); per wall-clock second is shown but not judged, since runs share the CPU cores")


class Curve(NamedTuple):
    steps: list[int]
    episodes: list[float]  # cumulative train/episodes up to and including each step
    seconds: list[float]   # StepMetrics time since the run's first step
    values: list[float]

    def axis(self, name: str) -> list[float]:
        return {"step": self.steps, "episode": self.episodes, "second": self.seconds}[name]  # type: ignore[return-value]


def read_axes(run_dir: Path, metric: str, horizon: int | None = None) -> Curve:
    """One metric of one run on all three axes; a step logged twice (a crash between writes) counts once.

    Held-out ``eval/*`` values are placed at ``eval/step``, the policy they evaluated (the server
    merges a finished round into that step's row; step 0, the untrained policy: no episodes, 0 s)."""
    file = run_dir / runs.METRICS_FILE
    if not file.is_file():
        return Curve([], [], [], [])
    by_step: dict[int, dict[str, Any]] = {}
    for line in file.read_text().splitlines():
        if line.strip():
            item = json.loads(line)
            merged = by_step.setdefault(int(item["step"]), {"time": float(item["time"]), "metrics": {}})
            merged["metrics"].update(item.get("metrics", {}))
    at: dict[int, tuple[float, float]] = {}  # step -> (cumulative episodes, seconds since the first step)
    points: dict[int, float] = {}
    episodes, start = 0.0, None
    for step in sorted(by_step):
        item = by_step[step]
        episodes += float(item["metrics"].get("train/episodes", 0.0))
        start = item["time"] if start is None else start
        at[step] = (episodes, item["time"] - start)
        value = item["metrics"].get(metric)
        if value is not None:
            points[int(item["metrics"].get("eval/step", step)) if metric.startswith("eval/") else step] = float(value)
    curve = Curve([], [], [], [])
    for step in sorted(s for s in points if horizon is None or s <= horizon):
        eps, seconds = at.get(step, (0.0, 0.0))
        curve.steps.append(step)
        curve.episodes.append(eps)
        curve.seconds.append(seconds)
        curve.values.append(points[step])
    return curve


def choose_metric(requested: str, run_dirs: Iterable[Path]) -> tuple[str, str]:
    """(metric, sentence saying which and why): held-out evaluation when every usable run (pass only
    runs that ended cleanly: a crash before the first evaluation must not veto it) with a training curve
    also holds ``eval/reward_mean`` at ``MIN_EVAL_POINTS`` steps or more."""
    if requested != TRAIN_METRIC:
        return requested, f"Verdicts use `{requested}`, the metric the plan judges."
    trained = [d for d in run_dirs if read_axes(d, TRAIN_METRIC).steps]
    if trained and all(len(read_axes(d, EVAL_METRIC).steps) >= MIN_EVAL_POINTS for d in trained):
        return EVAL_METRIC, (f"Verdicts use `{EVAL_METRIC}` (held-out evaluation at a fixed step interval), "
                             f"present in all {len(trained)} runs; `{TRAIN_METRIC}` is the sampled batch's reward.")
    return TRAIN_METRIC, (f"Verdicts use `{TRAIN_METRIC}` (the reward of the sampled training batch): not every run "
                          f"holds a held-out `{EVAL_METRIC}`.")


def _cell(values: Sequence[float]) -> dict[str, Any]:
    e = stats.mean_ci(values)
    return {"mean": e.mean, "hw": _finite(e.half_width), "n": e.n}


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def arm_key(overrides: dict[str, Any]) -> str:
    return json.dumps(overrides, sort_keys=True, default=str)


def _score(arms: list[dict[str, Any]], metric: str, horizon: int) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Each arm's per-seed AUC on every axis over budgets all its usable runs reached."""
    least = MIN_EVAL_POINTS if metric == EVAL_METRIC else MIN_POINTS
    curves = {id(t): read_axes(Path(t["run_dir"]), metric) for a in arms for t in a["trials"]}
    usable = [c for a in arms for t in a["trials"] if t["status"] in OK_STATUSES
              for c in [curves[id(t)]] if len(c.steps) >= least]
    if usable:
        # Runs cut by the deadline are compared with the others over the steps they all reached.
        horizon = min(horizon, min(c.steps[-1] for c in usable))
    kept = [_cut(c, horizon) for c in usable]
    budgets = {"step": float(horizon),
               "episode": min((c.episodes[-1] for c in kept if c.steps), default=0.0),
               "second": min((c.seconds[-1] for c in kept if c.steps), default=0.0)}
    rows = []
    for arm in arms:
        row: dict[str, Any] = {k: arm[k] for k in ("name", "value", "overrides")}
        row |= {"statuses": [], "aucs": [], "finals": [], "runs": [], "scores": {a: [] for a in AXES},
                "iterations": sorted({t.get("iteration", 0) for t in arm["trials"]})}
        for trial in arm["trials"]:
            row["statuses"].append(trial["status"])
            c = curves[id(trial)]
            if trial["status"] not in OK_STATUSES or len(c.steps) < least or c.steps[0] > horizon:
                continue
            c = _cut(c, horizon)
            row["aucs"].append(stats.auc(c.steps, c.values, horizon))
            row["finals"].append(stats.final_level(c.values))
            row["runs"].append(trial["run_dir"])
            row["scores"]["step"].append(row["aucs"][-1])
            for axis in (a for a in AXES if a != "step" and budgets[a] > 0):
                row["scores"][axis].append(stats.auc_until(c.axis(axis), c.values, budgets[axis]))
        if row["aucs"]:
            row["auc"], row["final"] = _cell(row["aucs"]), _cell(row["finals"])
            row["axes"] = {a: _cell(row["scores"][a]) for a in AXES if row["scores"][a]}
        rows.append(row)
    return rows, budgets


def _cut(c: Curve, horizon: int) -> Curve:
    """``c`` up to ``horizon``, ending at ``horizon`` where it goes past it: held-out evaluation runs every
    few steps and lands on different steps in different runs (``[0, 6, 8]``, ``[0, 7]``), so a run with no
    point at the shared horizon gets one interpolated there instead of being cut back to its start."""
    n = sum(1 for s in c.steps if s <= horizon)
    cut = Curve(*(list(xs[:n]) for xs in c))
    if 0 < n < len(c.steps) and c.steps[n - 1] < horizon:
        w = (horizon - c.steps[n - 1]) / (c.steps[n] - c.steps[n - 1])
        cut.steps.append(horizon)
        for whole, part in ((c.episodes, cut.episodes), (c.seconds, cut.seconds), (c.values, cut.values)):
            part.append(whole[n - 1] + w * (whole[n] - whole[n - 1]))
    return cut


def compare(better: dict[str, Any], worse: dict[str, Any], axis: str, min_effect: float,
            noise_sd: float | None) -> dict[str, Any]:
    """better − worse on one axis: the 95% CI, whether it excludes 0 (``clear``), whether it lies within
    ±min_effect (``equivalent``), and the seeds per arm estimated to resolve it."""
    d = stats.diff_ci(better["scores"][axis], worse["scores"][axis])
    hw = _finite(d.half_width)
    seeds = min(len(better["scores"][axis]), len(worse["scores"][axis]))
    equivalent = hw is not None and abs(d.mean) + hw < min_effect
    needed = stats.seeds_needed(d.mean, noise_sd, min_effect)
    if needed is not None and not (d.low > 0 or equivalent):
        # Unresolved with ``seeds`` seeds: more are needed, even where the pooled sd (which averages the
        # arms' spreads) says fewer would do.
        needed = max(needed, seeds + 1)
    return {"better": better["name"], "worse": worse["name"], "better_value": better["value"],
            "worse_value": worse["value"], "better_label": better["label"], "worse_label": worse["label"],
            "axis": axis, "diff": d.mean, "hw": hw, "clear": d.low > 0, "equivalent": equivalent, "seeds": seeds, "seeds_needed": needed}


def evidence(knob: str, metric: str, horizon: int, trials: list[dict[str, Any]], min_effect: float,
             shape: str | None = None, metric_note: str = "") -> dict[str, Any]:
    """Pool trials by configuration (same overrides = same arm, whatever iteration ran it) and score them.

    ``trials`` carry ``overrides``, ``experiment``, ``iteration``, ``run_dir`` and ``status``. The arm is
    named after the latest experiment that ran it."""
    groups: dict[tuple[str, int], dict[str, Any]] = {}
    twins: dict[tuple[int, str], list[str]] = {}  # per iteration and configuration: its experiment names in order
    for t in sorted(trials, key=lambda t: t.get("iteration", 0)):
        # Arms with the same overrides in one iteration (an A/A check) stay apart: the n-th of them pools
        # with the n-th of another iteration.
        names = twins.setdefault((t.get("iteration", 0), arm_key(t["overrides"])), [])
        if t["experiment"] not in names:
            names.append(t["experiment"])
        key = (arm_key(t["overrides"]), names.index(t["experiment"]))
        arm = groups.setdefault(key, {"overrides": t["overrides"], "trials": []})
        arm["name"], arm["value"] = t["experiment"], t["overrides"].get(knob)
        arm["trials"].append(t)
    rows, budgets = _score(list(groups.values()), metric, horizon)
    twin_values = [repr(r["value"]) for r in rows]
    for r in rows:  # the knob's value names an arm unless two arms share it (then the experiment name too)
        shared = twin_values.count(repr(r["value"])) > 1
        r["label"] = f"{r['name']} ({knob}={r['value']})" if shared else f"{knob}={r['value']}"
    # An axis is measured when every usable run reached a budget on it (runs without train/episodes or
    # with a single timestamp have none).
    measured = [a for a in AXES if a == "step" or budgets[a] > 0]
    axis, why = primary_axis(knob)
    if axis not in measured:
        axis, why = "step", f"judged per training step: the runs record no {AXIS_UNIT[axis]} axis to judge on"
    noise = {}
    for a in measured:
        sd, seeds = stats.pooled_sd([r["scores"][a] for r in rows])
        noise[a] = {"sd": sd, "seeds": seeds, "arms": sum(1 for r in rows if len(r["scores"][a]) >= 2)}
    scored = sorted((r for r in rows if "auc" in r), key=lambda r: r["axes"][axis]["mean"], reverse=True)
    out: dict[str, Any] = {"knob": knob, "metric": metric, "metric_note": metric_note, "axis": axis, "axis_why": why,
                           "budgets": budgets, "measured": measured, "horizon": int(budgets["step"]),
                           "min_effect": min_effect, "noise_floor": noise, "arms": rows, "best": None, "best_value": None, "comparison": None,
                           "axes_compared": {}, "sweep": shape == "sweep" or (shape != "factorial" and len(rows) >= SWEEP_MIN)}
    if scored:
        out["best"], out["best_value"] = scored[0]["name"], scored[0]["value"]
    if len(scored) > 1:
        out["comparison"] = compare(scored[0], scored[1], axis, min_effect, noise[axis]["sd"])
        out["axes_compared"] = {a: compare(scored[0], scored[1], a, min_effect, noise[a]["sd"]) for a in measured}
    return out


def summarize(iteration: int, knob: str, metric: str, horizon: int, experiments: list[dict[str, Any]],
              trials: list[dict[str, Any]], min_effect: float, previous_best: dict[str, Any] | None,
              earlier: Sequence[dict[str, Any]] = (), shape: str | None = None) -> dict[str, Any]:
    """This iteration's table plus ``study``: the evidence pooled with ``earlier`` iterations' trials.

    ``best``/``comparison`` are the study's (pooled) ones: the planner re-runs an unresolved pair until
    the pooled interval resolves it, and refines around the best of the whole study."""
    overrides = {e["name"]: e["overrides"] for e in experiments}
    mine = [{**t, "overrides": overrides.get(t["experiment"], {}), "iteration": iteration} for t in trials
            if t["experiment"] in overrides]
    pooled = [*earlier, *mine]
    metric, note = choose_metric(metric, [Path(t["run_dir"]) for t in pooled if t["status"] in OK_STATUSES])
    here = evidence(knob, metric, horizon, mine, min_effect, shape, note)
    order = {e["name"]: i for i, e in enumerate(experiments)}
    rows = sorted(here["arms"], key=lambda r: order.get(r["name"], len(order)))
    for exp in experiments:  # an experiment with no trial at all still shows (as a negative result)
        if not any(r["name"] == exp["name"] for r in rows):
            rows.append({"name": exp["name"], "value": exp["overrides"].get(knob), "overrides": exp["overrides"],
                         "statuses": [], "aucs": [], "finals": [], "runs": [], "scores": {a: [] for a in AXES}})
    study = evidence(knob, metric, horizon, pooled, min_effect, shape, note) if earlier else here
    summary: dict[str, Any] = {"iteration": iteration, "knob": knob, "metric": metric, "horizon": here["horizon"],
                               "experiments": rows, "best": study["best"], "best_value": study["best_value"],
                               "comparison": study["comparison"], "iteration_comparison": here["comparison"],
                               "plateau": None, "study": study}
    scored = [r for r in rows if "auc" in r]
    if previous_best is not None and previous_best.get("value") is not None and len(scored) > 1:
        # The incumbent re-ran on fresh seeds. Plateau only when the evidence says so: the whole 95% CI of
        # (best challenger − incumbent) lies below min_effect. A wide CI is "unresolved", never a plateau.
        incumbent = next((r for r in scored if r["value"] == previous_best["value"]), None)
        # Twins of the incumbent (an A/A check) are no challengers: the knob did not change.
        challengers = sorted((r for r in scored
                              if incumbent is not None and repr(r["value"]) != repr(incumbent["value"])),
                             key=lambda r: r["auc"]["mean"], reverse=True)
        gain = stats.diff_ci(challengers[0]["aucs"], incumbent["aucs"]) if incumbent and challengers else None
        if gain is not None and math.isfinite(gain.high) and gain.high < min_effect:
            summary["plateau"] = (f"{knob}={challengers[0]['value']} did not beat {knob}={incumbent['value']} by more "
                                  f"than {min_effect} in area under the curve: the knob has plateaued")
    return summary


def backfill(history: list[dict[str, Any]], layout: StudyLayout, min_effect: float) -> list[dict[str, Any]]:
    """``history`` with the pooled evidence (``study``) in every summary.

    A state written before pooled evidence existed holds summaries without ``study``, and ``verdicts.verdict``
    would answer "No answer". Each such summary is summarized again from the runs on disk (run.json
    records, the overrides its experiments list), pooled with the iterations before it."""
    if all(s.get("study") for s in history):
        return history
    records = runs.all_records(layout.runs_dir)
    out: list[dict[str, Any]] = []
    earlier: list[dict[str, Any]] = []
    for s in history:
        knob = s["knob"]
        overrides = {e["name"]: e.get("overrides", {knob: e.get("value")}) for e in s["experiments"]}
        mine = [{"experiment": r.experiment, "seed": r.seed, "status": r.status,
                 "run_dir": str(layout.run_dir(r.iteration, r.trial))}
                for r in records if r.iteration == s["iteration"] and r.experiment in overrides]
        if s.get("study"):
            out.append(s)
        else:
            last = out[-1] if out else None
            previous = {"name": last["best"], "value": last["best_value"]} if last and last.get("best") else None
            experiments = [{"name": name, "overrides": o} for name, o in overrides.items()]
            new = summarize(s["iteration"], knob, s["metric"], s["horizon"], experiments, mine, min_effect, previous,
                            earlier)
            for row in [*new["experiments"], *new["study"]["arms"]]:
                row.pop("runs", None)  # as analyze stores them: numbers only
            out.append({**s, **new})
        earlier += [{**t, "overrides": overrides[t["experiment"]], "iteration": s["iteration"]} for t in mine]
    return out
