"""Benchmark: how often does a study at the README's budget find an effect near the minimum, with and
without coupled arms? (issue #61, item 4)

Two parts.

1. **Measure once, with many seeds** (real runs). One designed comparison on letters: a control learning
   rate and three treatments chosen to beat it by about 1×, 2× and 4× ``min_effect`` (0.02) in held-out
   reward AUC per training step. It runs ``--seeds`` seeds of every arm twice, on the same seeds: coupled
   (``--couple``) and with independent sampling noise (``--no-couple``). A treatment's true effect is the
   mean of its per-seed paired differences over both runs; each run also gives the spread of those
   differences in its noise mode.
2. **Decide as a study would** (the study's own rules). The registered design of a real study at
   ``--budget`` fixes the looks: its pilot's seeds, the seeds its budget runs (``max_seeds``, sized from the
   pilot's measured seconds a run) and the even batches after the pilot (``researcher.evidence.sizing``).
   Each of ``--studies`` simulated studies draws its seeds' paired differences from the measured ones, with
   replacement, and stops at the first look whose interval at its boundary (``evidence.looks``) settles the
   verdict (``findings.verdicts``). Power is the share answering Yes.

Why resample rather than run every study: at 10 minutes a study, 3 effects × 2 noise modes × 20 studies is
20 hours of this machine. The runs of part 1 are the same runs a study makes (server, client, held-out
rounds, the verdict's axis and window); only the study's sampling of seeds is simulated. ``--real`` real
studies at the budget, at the effect nearest 2×, check it: the first fixes the looks, and their Answers
are counted (``RESULT real_studies=<n> real_yes=<k> effect=<k>x budget=<b>``).

One line per effect:
``RESULT effect=<k>x min_effect=<x> true_effect=<x> power_independent=<x> power_coupled=<x>
sd_independent=<x> sd_coupled=<x> seeds_max=<n> looks=<n> studies=<n> seeds_for_power_0.8_independent=<n>
seeds_for_power_0.8_coupled=<n>`` (the last two: the seeds an arm the same looks would need for power 0.8,
a larger budget's study; None beyond 32).

    .venv/bin/python tests/bench/bench_power.py [--seeds 16] [--steps 30] [--budget 10m]
        [--control 3e-4] [--treatments 3.6e-4,4.4e-4,6.5e-4] [--studies 4000] [--real 1] [--out DIR]
        [--plan PLAN_JSON]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_coupling import RESEARCHER, ROOT

from researcher.evidence import looks, stats
from researcher.findings import verdicts
from researcher.findings.records import Evidence, IterationSummary, LookPlan, PlanFile, SequentialDesign
from researcher.planner.designed import Design, DesignArm, topic_for
from researcher.study.layout import StudyLayout

MIN_EFFECT = 0.02  # StudyOptions.min_effect's default
MAX_SEEDS = 32  # the most seeds an arm ``seeds_for`` tries


def design(control: float, treatments: list[float]) -> Design:
    arms = [DesignArm(name="control", overrides={"lr": control})]
    arms += [DesignArm(name=f"t{i + 1}", overrides={"lr": lr}) for i, lr in enumerate(treatments)]
    return Design(task="letters", arms=arms)


def start(out: Path, name: str, plan: Design, flags: list[str]) -> Path:
    """``researcher start --design`` in a subprocess; the study's folder (its artifacts beside it)."""
    dirs = ["--studies-dir", str(out / "studies"), "--artifacts-dir", str(out / "artifacts")]
    with open(out / f"{name}.log", "w") as log:
        subprocess.run([*RESEARCHER, "start", "--topic", topic_for(plan), "--design", json.dumps(plan.model_dump()),
                        "--study-id", name, *flags, *dirs], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                       timeout=6 * 3600, check=False)
    return out / "studies" / name


def measured(out: Path, name: str, plan: Design, seeds: int, steps: int, couple: bool) -> Evidence:
    """Part 1: every arm on ``seeds`` seeds in one look; the study's whole evidence."""
    flags = ["--seeds", str(seeds), "--max-iterations", "1", "--steps-per-run", str(steps), "--seed-base", "0",
             "--max-runs", str(seeds * len(plan.arms)), "--parallel", "2", "--budget", "6h",
             "--couple" if couple else "--no-couple"]
    analysis = StudyLayout(name, out / "studies", out / "artifacts").artifacts_dir / "analysis-1.json"
    if not analysis.is_file():  # a study measured before (--out reused) is read, not run again
        start(out, name, plan, flags)
    if not analysis.is_file():
        raise SystemExit(f"{name}: the study wrote no analysis; see {out / f'{name}.log'}")
    evidence = IterationSummary.model_validate_json(analysis.read_text()).study
    if evidence is None:
        raise SystemExit(f"{name}: its analysis holds no evidence; see {out / f'{name}.log'}")
    return evidence


def real_study(out: Path, index: int, plan: Design, budget: str) -> str:
    """One real study at ``budget`` on seeds of its own (reused when ``out`` holds it): its Answer."""
    report = out / "studies" / f"real-{index}" / "report.md"
    if not report.is_file():
        start(out, f"real-{index}", plan, ["--budget", budget, "--seed-base", str(100_000 + 10_000 * index)])
    return report.read_text().split("## Answer\n\n", 1)[-1].split("\n\n", 1)[0] if report.is_file() else ""


def differences(evidence: Evidence, treatment: str) -> list[float]:
    """``treatment`` − control per seed both ran, on the verdict's axis."""
    arms = {a.name.split("-", 1)[-1]: a for a in evidence.arms}
    scores = {name: dict(zip(arm.seeds, arm.scores.get(evidence.axis, []), strict=False)) for name, arm in arms.items()}
    control, treated = scores["control"], scores[treatment]
    return [treated[s] - control[s] for s in sorted(control.keys() & treated.keys())]


def schedule(plan_json: Path) -> tuple[SequentialDesign, list[LookPlan]]:
    """The registered design of a real study and its looks: the pilot, then ``max_seeds`` in even batches
    (``sizing.next_look`` when the budget runs what it was sized to). A study that settled early registered
    only the looks it took; the rest follow the same rule."""
    registered = PlanFile.model_validate_json(plan_json.read_text()).design
    if registered is None or registered.max_seeds is None:
        raise SystemExit(f"{plan_json}: no sized design (the study ended before its pilot was sized)")
    return registered, looks_of(registered, registered.max_seeds)


def looks_of(registered: SequentialDesign, max_seeds: int) -> list[LookPlan]:
    """``registered``'s looks had it been sized to ``max_seeds`` seeds an arm."""
    plans = [LookPlan(look=1, seeds=registered.pilot_seeds, fraction=1.0 if registered.looks == 1 else None)]
    while plans[-1].fraction != 1.0:
        left = registered.looks - len(plans)
        seeds = plans[-1].seeds + -(-(max_seeds - plans[-1].seeds) // left)
        last = left == 1 or seeds >= max_seeds
        plans.append(LookPlan(look=len(plans) + 1, seeds=seeds, fraction=1.0 if last else seeds / max_seeds))
    return plans


def seeds_for(diffs: list[float], registered: SequentialDesign, studies: int, aim: float = 0.8) -> int | None:
    """The fewest seeds an arm (up to ``MAX_SEEDS``) whose looks give power ``aim``; None if none do."""
    return next((n for n in range(registered.pilot_seeds + 1, MAX_SEEDS + 1)
                 if power(diffs, registered, looks_of(registered, n), studies, n) >= aim), None)


def power(diffs: list[float], registered: SequentialDesign, plans: list[LookPlan], studies: int, seed: int) -> float:
    """Part 2: the share of ``studies`` simulated studies, drawing seeds from ``diffs``, that answer Yes."""
    at_look = [looks.current(registered, plans[:k + 1]) for k in range(len(plans))]
    rng = random.Random(seed)
    yes = 0
    for _ in range(studies):
        drawn = [rng.choice(diffs) for _ in range(plans[-1].seeds)]
        for plan, look in zip(plans, at_look, strict=True):
            seen = dict(enumerate(drawn[:plan.seeds]))
            estimate = stats.compare_arms(seen, dict.fromkeys(seen, 0.0))
            verdict = verdicts.classify(estimate.mean, look.half_width(estimate) if look else estimate.half_width,
                                        MIN_EFFECT)
            if verdicts.settled(verdict):
                yes += verdict is verdicts.Verdict.YES
                break
    return yes / studies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=16, help="seeds of every arm in part 1 (at most 16)")
    parser.add_argument("--steps", type=int, default=30, help="steps a run (the study default)")
    parser.add_argument("--budget", default="10m", help="the budget whose registered looks part 2 follows")
    parser.add_argument("--control", type=float, default=3e-4)
    parser.add_argument("--treatments", default="3.6e-4,4.4e-4,6.5e-4", help="about 1x, 2x, 4x min_effect")
    parser.add_argument("--studies", type=int, default=4000, help="simulated studies per effect and noise mode")
    parser.add_argument("--real", type=int, default=1, help="real studies at --budget at the 2x effect (the "
                                                            "first one's registered looks drive the simulation)")
    parser.add_argument("--plan", type=Path, default=None, help="a study's plan.json to take the looks from instead")
    parser.add_argument("--out", type=Path, default=None, help="keep (and reuse) the studies here")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-power-"))
    out.mkdir(parents=True, exist_ok=True)
    treatments = [float(v) for v in args.treatments.split(",")]
    plan = design(args.control, treatments)
    print(f"bench_power: lr {args.control:g} against {', '.join(f'{v:g}' for v in treatments)} · {args.seeds} seeds "
          f"× {args.steps} steps, coupled and independent · looks of a {args.budget} study · out {out}", flush=True)
    started = time.monotonic()
    evidence = {couple: measured(out, f"measure-{'coupled' if couple else 'independent'}", plan, args.seeds,
                                 args.steps, couple) for couple in (True, False)}
    print(f"part 1: {(time.monotonic() - started) / 60:.1f} min", flush=True)
    diffs = {(t, couple): differences(evidence[couple], f"t{t + 1}") for t in range(len(treatments))
             for couple in (True, False)}
    true = [statistics.fmean(diffs[t, True] + diffs[t, False]) for t in range(len(treatments))]
    middle = min(range(len(treatments)), key=lambda t: abs(true[t] - 2 * MIN_EFFECT))
    plan_json = args.plan
    if args.real:  # real studies at the budget, at the effect nearest 2x min_effect, coupled (the default)
        at_budget = design(args.control, [treatments[middle]])
        answers = [real_study(out, i, at_budget, args.budget) for i in range(args.real)]
        for i, answer in enumerate(answers):
            print(f"real study {i} at {args.budget} (lr {args.control:g} vs {treatments[middle]:g}): {answer[:300]}",
                  flush=True)
        yes = sum(verdicts.answer_class(a) is verdicts.Verdict.YES for a in answers)
        print(f"RESULT real_studies={args.real} real_yes={yes} effect={true[middle] / MIN_EFFECT:.1f}x "
              f"budget={args.budget}", flush=True)
        plan_json = plan_json or out / "studies" / "real-0" / "plan.json"
    if plan_json is None:
        raise SystemExit("no study to take the looks from: give --plan or --real 1 or more")
    registered, plans = schedule(plan_json)
    print(f"looks: {', '.join(f'{p.seeds} seeds' for p in plans)} an arm (pilot first; {registered.spending}, "
          f"alpha {registered.alpha})", flush=True)
    for t, lr in enumerate(treatments):
        # Both pools centred on the true effect: the modes then differ in their spread only, not in their
        # 16-seed estimates of the same mean.
        ind, cpl = ([d - statistics.fmean(diffs[t, c]) + true[t] for d in diffs[t, c]] for c in (False, True))
        print(f"  lr {lr:g}: independent {[round(v, 4) for v in diffs[t, False]]}\n  lr {lr:g}: coupled     "
              f"{[round(v, 4) for v in diffs[t, True]]}", flush=True)
        print(f"RESULT effect={true[t] / MIN_EFFECT:.1f}x min_effect={MIN_EFFECT} true_effect={true[t]:+.4f} "
              f"power_independent={power(ind, registered, plans, args.studies, t):.3f} "
              f"power_coupled={power(cpl, registered, plans, args.studies, t):.3f} "
              f"sd_independent={statistics.stdev(ind):.4f} sd_coupled={statistics.stdev(cpl):.4f} "
              f"seeds_max={plans[-1].seeds} looks={len(plans)} studies={args.studies} "
              f"seeds_for_power_0.8_independent={seeds_for(ind, registered, args.studies // 4)} "
              f"seeds_for_power_0.8_coupled={seeds_for(cpl, registered, args.studies // 4)}", flush=True)


if __name__ == "__main__":
    main()
