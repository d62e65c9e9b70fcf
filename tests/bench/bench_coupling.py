"""Benchmark: how much does coupling a comparison's arms (shared sampling noise) shrink its paired noise?
(issue #61, item 3)

For each claim, one designed comparison study runs ``--seeds`` pairs twice on the same seeds, so both
times every pair draws the same tasks: once with independent sampling noise (``--no-couple``) and once
coupled (``--couple``: ``swarm serve --coupled``, the arms' servers key each token's noise by seed, task,
sample and position, ``researcher.study.coupling``). Everything else is the study's own machinery
(``researcher start --design``: server, client, held-out rounds, the verdict's axis and window).

``variance_ratio`` is the variance of the paired difference of the verdict metric (held-out reward AUC on
the study's verdict axis) with independent noise, divided by its variance coupled: 2 means coupling halves
the seeds a study needs for the same interval. With few pairs the ratio itself is noisy; its 90% interval
(an F interval, the pairs taken as independent normal draws) is printed beside it. Per claim:

``RESULT claim=<name> variance_ratio=<x> low=<x> high=<x> pairs=<n> sd_independent=<x> sd_coupled=<x>
mean_independent=<x> mean_coupled=<x> minutes=<m>``

    .venv/bin/python tests/bench/bench_coupling.py [--claims kl,lr,group-size] [--seeds 8] [--steps 30]
        [--out DIR] [--model smollm2-135m --claims gsm-lr,gsm-random --seeds 3 --steps 5]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from researcher.findings.records import Evidence, IterationSummary
from researcher.planner.designed import Design, topic_for
from researcher.study.layout import StudyLayout

ROOT = Path(__file__).resolve().parents[2]
RESEARCHER = [sys.executable, "-m", "researcher.cli"]

GSM = ROOT / "studies" / "examples" / "gsm-format"
# gsm-format is a data task (task "data"), passed as the replication campaign passes its SmolLM2 claims.
GSM_FLAGS = ["--data", str(GSM / "train.jsonl"), "--heldout", str(GSM / "test.jsonl"),
             "--reward", f"{GSM / 'reward.py'}:score"]
# The replication file's own server config for its SmolLM2 claims: sync mode, so coupled arms sample alike.
GSM_SYNC_FLAGS = [*GSM_FLAGS, "--data-config", str(ROOT / "studies" / "replications" / "smollm2-gsm.toml")]

# name: (task, control overrides, treatment overrides, extra `researcher start` flags); the issue's three
# tiny claims and a SmolLM2 one.
CLAIMS: dict[str, tuple[str, dict[str, Any], dict[str, Any], list[str]]] = {
    "kl": ("letters", {"kl_coef": 0.0}, {"kl_coef": 0.2}, []),
    "lr": ("letters", {"lr": 3e-4}, {"lr": 1e-3}, []),
    "group-size": ("letters", {"group_size": 8}, {"group_size": 2}, []),  # judged per episode consumed
    "gsm-lr": ("data", {"lr": 1e-5}, {"lr": 3e-5}, GSM_FLAGS),  # SmolLM2 (--model smollm2-135m), async
    # The replication file's spurious-rewards claim (a coin's reward against the real one), in sync mode.
    "gsm-random": ("data", {"random_reward": 0.0}, {"random_reward": 0.5}, GSM_SYNC_FLAGS),
}


def study(out: Path, name: str, claim: str, couple: bool, seeds: int, steps: int, model: str | None) -> Evidence | None:
    """One single-look comparison study of ``claim``; its whole-study evidence (None if it produced none)."""
    task, control, treatment, task_flags = CLAIMS[claim]
    design = Design(task=task, arms=[{"name": "control", "overrides": control},  # type: ignore[list-item]
                                     {"name": "treatment", "overrides": treatment}])  # type: ignore[list-item]
    dirs = ["--studies-dir", str(out / "studies"), "--artifacts-dir", str(out / "artifacts")]
    flags = ["--couple" if couple else "--no-couple", *(["--model", model] if model else []), *task_flags]
    done = subprocess.run([*RESEARCHER, "start", "--topic", topic_for(design), "--design",
                           json.dumps(design.model_dump()), "--study-id", name, "--seeds", str(seeds),
                           "--max-iterations", "1", "--steps-per-run", str(steps), "--seed-base", "0",
                           "--parallel", "2", "--budget", "3h", *flags, *dirs],
                          cwd=ROOT, capture_output=True, text=True, timeout=4 * 3600)
    analysis = StudyLayout(name, out / "studies", out / "artifacts").artifacts_dir / "analysis-1.json"
    if done.returncode != 0 or not analysis.is_file():
        print(f"  {name}: no analysis (exit {done.returncode}): {done.stdout[-400:]}{done.stderr[-400:]}", flush=True)
        return None
    return IterationSummary.model_validate_json(analysis.read_text()).study


def paired_differences(evidence: Evidence, axis: str) -> dict[int, float]:
    """treatment − control per seed both arms ran, on ``axis``."""
    arms = {a.name.split("-", 1)[-1]: a for a in evidence.arms}
    control, treatment = arms["control"], arms["treatment"]
    a = dict(zip(treatment.seeds, treatment.scores.get(axis, []), strict=False))
    b = dict(zip(control.seeds, control.scores.get(axis, []), strict=False))
    return {seed: a[seed] - b[seed] for seed in sorted(a.keys() & b.keys())}


def ratio_interval(ratio: float, n_independent: int, n_coupled: int, level: float = 0.90) -> tuple[float, float]:
    """The F interval of a variance ratio (independent over coupled), ``nan`` where scipy is absent."""
    try:
        from scipy.stats import f
    except ImportError:
        return math.nan, math.nan
    d1, d2, tail = n_independent - 1, n_coupled - 1, (1 - level) / 2
    return ratio / f.ppf(1 - tail, d1, d2), ratio / f.ppf(tail, d1, d2)


def measure(out: Path, claim: str, seeds: int, steps: int, model: str | None) -> str:
    started = time.monotonic()
    coupled = study(out, f"{claim}-coupled", claim, True, seeds, steps, model)
    independent = study(out, f"{claim}-independent", claim, False, seeds, steps, model)
    minutes = (time.monotonic() - started) / 60
    if coupled is None or independent is None:
        return f"RESULT claim={claim} variance_ratio=nan pairs=0 minutes={minutes:.1f}"
    axis = independent.axis  # the verdict's axis (group size: per episode consumed)
    d_ind, d_cpl = paired_differences(independent, axis), paired_differences(coupled, axis)
    print(f"  {claim} ({axis}): independent {[round(v, 4) for v in d_ind.values()]}\n"
          f"  {claim} ({axis}): coupled     {[round(v, 4) for v in d_cpl.values()]}", flush=True)
    if len(d_ind) < 2 or len(d_cpl) < 2:
        return f"RESULT claim={claim} variance_ratio=nan pairs={min(len(d_ind), len(d_cpl))} minutes={minutes:.1f}"
    var_ind, var_cpl = statistics.variance(d_ind.values()), statistics.variance(d_cpl.values())
    ratio = var_ind / var_cpl if var_cpl > 0 else math.inf
    low, high = ratio_interval(ratio, len(d_ind), len(d_cpl))
    return (f"RESULT claim={claim} variance_ratio={ratio:.2f} low={low:.2f} high={high:.2f} "
            f"pairs={min(len(d_ind), len(d_cpl))} sd_independent={math.sqrt(var_ind):.4f} "
            f"sd_coupled={math.sqrt(var_cpl):.4f} mean_independent={statistics.fmean(d_ind.values()):+.4f} "
            f"mean_coupled={statistics.fmean(d_cpl.values()):+.4f} minutes={minutes:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--claims", default="kl,lr,group-size", help=f"comma-separated, of {', '.join(CLAIMS)}")
    parser.add_argument("--seeds", type=int, default=8, help="pairs per study")
    parser.add_argument("--steps", type=int, default=30, help="steps a run at the task's own batch size")
    parser.add_argument("--model", default=None, help="every run's --model (gsm-lr, gsm-random: smollm2-135m)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    claims = [c.strip() for c in args.claims.split(",") if c.strip()]
    if unknown := [c for c in claims if c not in CLAIMS]:
        parser.error(f"unknown claims {unknown}; known: {', '.join(CLAIMS)}")
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-coupling-"))
    print(f"bench_coupling: {', '.join(claims)} · {args.seeds} pairs × {args.steps} steps · out {out}", flush=True)
    for claim in claims:
        print(measure(out, claim, args.seeds, args.steps, args.model), flush=True)


if __name__ == "__main__":
    main()
