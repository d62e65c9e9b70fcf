"""Turn one iteration's runs into evidence: per-configuration mean ± 95% CI of the area under the
reward curve (per training step) and of the final reward, the best configuration, and a verdict.

Results are small dicts (they go into the graph state and analysis.json); curves are read from
each run's metrics.jsonl. ``verdict`` is the one place the study's answer is worded from numbers,
so the report, ``researcher status`` and the offline planner say the same thing.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from researcher import runs, stats

OK_STATUSES = ("finished", "cut")  # runs whose curve counts as evidence (cut = ended by the deadline)
MIN_POINTS = 3


def summarize(iteration: int, knob: str, metric: str, horizon: int, experiments: list[dict[str, Any]],
              trials: list[dict[str, Any]], min_effect: float, previous_best: dict[str, Any] | None) -> dict[str, Any]:
    # Runs cut by the deadline are compared with the others over the steps they all reached.
    last_steps = [runs.read_curve(Path(t["run_dir"]), metric, horizon)[0][-1:]
                  for t in trials if t["status"] in OK_STATUSES]
    usable = [steps[0] for steps in last_steps if steps and steps[0] >= MIN_POINTS]
    if usable:
        horizon = min(horizon, min(usable))
    rows = []
    for exp in experiments:
        aucs, finals, statuses, curves = [], [], [], []
        for trial in (t for t in trials if t["experiment"] == exp["name"]):
            statuses.append(trial["status"])
            steps, values = runs.read_curve(Path(trial["run_dir"]), metric, horizon)
            if trial["status"] in OK_STATUSES and len(steps) >= MIN_POINTS:
                aucs.append(stats.auc(steps, values, horizon))
                finals.append(stats.final_level(values))
                curves.append(trial["run_dir"])
        row: dict[str, Any] = {"name": exp["name"], "value": exp["overrides"].get(knob), "overrides": exp["overrides"],
                               "statuses": statuses, "aucs": aucs, "finals": finals, "runs": curves}
        if aucs:
            a, f = stats.mean_ci(aucs), stats.mean_ci(finals)
            row["auc"] = {"mean": a.mean, "hw": _finite(a.half_width), "n": a.n}
            row["final"] = {"mean": f.mean, "hw": _finite(f.half_width), "n": f.n}
        rows.append(row)
    scored = sorted((r for r in rows if "auc" in r), key=lambda r: r["auc"]["mean"], reverse=True)
    summary: dict[str, Any] = {"iteration": iteration, "knob": knob, "metric": metric, "horizon": horizon,
                               "experiments": rows, "best": None, "best_value": None, "comparison": None,
                               "plateau": None}
    if not scored:
        return summary
    best = scored[0]
    summary["best"], summary["best_value"] = best["name"], best["value"]
    if len(scored) > 1:
        other = scored[1]
        diff = stats.diff_ci(best["aucs"], other["aucs"])
        summary["comparison"] = {"better": best["name"], "worse": other["name"], "diff": diff.mean,
                                 "hw": _finite(diff.half_width), "clear": diff.low > 0}
    if previous_best is not None and previous_best.get("value") is not None:
        # The incumbent re-ran on fresh seeds. Plateau only when the evidence says so: the whole 95% CI of
        # (best challenger − incumbent) lies below min_effect. A wide CI is "unresolved", never a plateau.
        incumbent = next((r for r in scored if r["value"] == previous_best["value"]), None)
        challengers = [r for r in scored if r is not incumbent]
        gain = stats.diff_ci(challengers[0]["aucs"], incumbent["aucs"]) if incumbent is not None and challengers else None
        if gain is not None and math.isfinite(gain.high) and gain.high < min_effect:
            summary["plateau"] = (f"{knob}={challengers[0]['value']} did not beat {knob}={incumbent['value']} by more "
                                  f"than {min_effect} in area under the curve: the knob has plateaued")
    return summary


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _est(cell: dict[str, Any] | None) -> str:
    if not cell:
        return "n/a"
    hw = cell.get("hw")
    return f"{cell['mean']:.3f} ± {hw:.3f}" if hw is not None else f"{cell['mean']:.3f} (n={cell['n']})"


def verdict(question: str, summaries: list[dict[str, Any]]) -> tuple[str, str]:
    """(answer, caveats) worded from the first iteration's controlled comparison and any refinement."""
    scored = [s for s in summaries if s.get("best")]
    if not scored:
        return ("No answer: no run produced a usable reward curve (see LOG.md for the crashes).",
                "Every run crashed, stalled or was cut before 3 training steps.")
    first = scored[0]
    knob, metric = first["knob"], first["metric"]
    rows = [r for r in first["experiments"] if "auc" in r]
    if len(rows) < 2:
        return (f"Inconclusive: only {knob}={rows[0]['value']} produced usable runs "
                f"(AUC {_est(rows[0]['auc'])}).", "A comparison needs at least two configurations with results.")
    low, high = _order(rows)
    diff = stats.diff_ci(high["aucs"], low["aucs"])
    evidence = (f"area under the {metric} curve over {first['horizon']} steps: {knob}={high['value']} "
                f"{_est(high['auc'])} vs {knob}={low['value']} {_est(low['auc'])}; final reward "
                f"{_est(high.get('final'))} vs {_est(low.get('final'))}; difference {diff.mean:+.3f} "
                f"(95% CI {diff.low:+.3f} to {diff.high:+.3f})")
    if diff.low > 0:
        answer = f"Yes: the larger {knob} ({high['value']}) learned faster per training step — {evidence}."
    elif diff.high < 0:
        answer = f"No: the larger {knob} ({high['value']}) learned slower per training step — {evidence}."
    else:
        leader = high if diff.mean > 0 else low
        answer = (f"Inconclusive: {knob}={leader['value']} was ahead on average but the 95% CI of the "
                  f"difference includes 0 — {evidence}.")
    caveats = [f"Seeds per configuration: {min(r['auc']['n'] for r in rows)}; with so few seeds the 95% CIs are wide.",
               "Learning speed is compared per training step, not per wall-clock second or per sample: a larger "
               "group also trains on more samples per step." if knob == "group_size" else
               "Learning speed is compared per training step, not per wall-clock second."]
    for s in scored[1:]:
        # Later iterations refine around the best on fresh seeds (their horizons may differ: compare within).
        c = s.get("comparison")
        detail = (f"{c['better']} − {c['worse']} = {c['diff']:+.3f}" + (f" ± {c['hw']:.3f}" if c["hw"] is not None else "")
                  + (" (clear)" if c["clear"] else " (CI includes 0)")) if c else f"best was {s['best']}"
        caveats.append(f"Refinement, iteration {s['iteration']} (over {s['horizon']} steps): {detail}"
                       + (f"; {s['plateau']}" if s.get("plateau") else "") + ".")
    bad = [st for s in summaries for r in s["experiments"] for st in r["statuses"] if st not in OK_STATUSES]
    if bad:
        caveats.append(f"{len(bad)} run(s) did not finish cleanly ({', '.join(sorted(set(bad)))}); they are "
                       "excluded from the statistics.")
    return answer, " ".join(caveats)


def _order(rows: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The two rows with the lowest and highest knob value (numbers and booleans sort; others by AUC)."""
    try:
        ordered = sorted(rows, key=lambda r: r["value"])
    except TypeError:
        ordered = sorted(rows, key=lambda r: r["auc"]["mean"])
    return ordered[0], ordered[-1]
