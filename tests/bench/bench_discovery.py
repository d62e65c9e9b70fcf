"""Benchmark: does a goal campaign find at least as much as greedy single-seed search on the same CPU, and
does it claim only what holds? (issue #60)

Three strategies pursue the same goal ("Make the <task> task learn faster per episode consumed") over the
same knobs, ladders and starting settings (``researcher.campaign.discover.start``), each for the same CPU:

1. the discovery campaign: ``researcher campaign start`` with the goal, its rounds of studies;
2. greedy single-seed hill climbing, as karpathy's autoresearch does: move one knob to a neighbouring level,
   do one run, keep the change if it beats the incumbent's one run;
3. random search: one run per random configuration, keep the best.

Every run goes through the same machinery (``researcher start --design``: the same server, client, held-out
rounds and per-episode AUC), and single runs train to the same episodes as the task's settings do. Each
strategy gets the same running time (``--budget``, start-ups and checks included, as a campaign's budget
counts them); CPU-hours are reported beside it. A
referee then runs each strategy's final configuration against the task's settings on fresh paired seeds.
``gain`` is the referee's mean difference (per-episode AUC of the held-out reward); ``claimed`` is what the
strategy itself believed its final gain to be (the campaign: its verified estimate; greedy and random: the
final run's score minus the settings' first run). Ends with:

``RESULT campaign_gain=… campaign_claimed=… greedy_gain=… greedy_claimed=… random_gain=… random_claimed=…
cpu_hours=…``

    .venv/bin/python tests/bench/bench_discovery.py --budget 20m --referee-seeds 10 [--task letters]
        [--steps 8] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from researcher.campaign import discover, goal, record, standing
from researcher.campaign.levels import describe
from researcher.evidence import stats
from researcher.findings.records import IterationSummary
from researcher.planner import catalog
from researcher.planner.arm_budgets import episodes_per_step
from researcher.planner.designed import Design, topic_for
from researcher.study.flags import parse_duration
from researcher.study.layout import StudyLayout

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "studies" / "examples"
RESEARCHER = [sys.executable, "-m", "researcher.cli"]
PARALLEL = 2  # the campaign's runs at once (one torch thread each); a single run gets both cores


@dataclass
class Search:
    """One strategy's state: its studies' root, the CPU it spent, its best configuration and its claim."""

    name: str
    root: Path
    final: dict[str, Any] = field(default_factory=dict)
    claimed: float = 0.0
    cpu_h: float = 0.0   # its runs' wall time x torch threads
    spent_s: float = 0.0  # its studies' running time, start-up and checks included: the budget's measure
    runs: int = 0


def _researcher(root: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    dirs = ["--studies-dir", str(root / "studies"), "--artifacts-dir", str(root / "artifacts")]
    return subprocess.run([*RESEARCHER, *args, *dirs], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _study(search: Search, study_id: str, design: Design, seeds: int, steps: int, seed_base: int,
           parallel: int = PARALLEL) -> IterationSummary | None:
    """Run one designed study of one look; its analysis (None when it produced none)."""
    started = time.monotonic()
    done = _researcher(search.root, "start", "--topic", topic_for(design), "--design", json.dumps(design.model_dump()),
                       "--study-id", study_id, "--seeds", str(seeds), "--max-iterations", "1", "--steps-per-run",
                       str(steps), "--seed-base", str(seed_base), "--parallel", str(parallel), "--budget", "2h",
                       "--max-runs", str(seeds * len(design.arms)), timeout=7200)  # a referee's 2 x 10 is over the 16 default
    search.spent_s += time.monotonic() - started
    layout = StudyLayout(study_id, search.root / "studies", search.root / "artifacts")
    search.cpu_h += standing.cpu_hours(layout)
    analysis = layout.artifacts_dir / "analysis-1.json"
    if done.returncode != 0 or not analysis.is_file():
        print(f"  {study_id}: no analysis (exit {done.returncode}): {done.stdout[-300:]}", flush=True)
        return None
    return IterationSummary.model_validate_json(analysis.read_text())


def single_run(search: Search, task: str, config: dict[str, Any], episodes: int, seed_base: int) -> float:
    """One run of ``config`` to ``episodes`` episodes on one seed: its per-episode AUC (-inf if it failed)."""
    search.runs += 1
    steps = math.ceil(episodes / episodes_per_step(config))
    design = Design(task=task, shape="runs", arms=[{"name": "run", "overrides": config}])  # type: ignore[list-item]
    summary = _study(search, f"{search.name}-{search.runs}", design, 1, steps, seed_base, parallel=1)  # both cores
    study = summary.study if summary else None
    scores = study.arms[0].scores.get("episode", []) if study and study.arms else []
    return scores[0] if scores else -math.inf


def greedy(search: Search, task: str, state: Any, episodes: int, budget_s: float, rng: random.Random) -> None:
    best = dict(state.defaults)
    base = score = single_run(search, task, best, episodes, 10_000)
    while search.spent_s < budget_s:
        knob = rng.choice(state.knobs)
        i = knob.ladder.index(best[knob.key]) if best[knob.key] in knob.ladder else 0
        j = i + (1 if i == 0 else -1 if i == len(knob.ladder) - 1 else rng.choice((-1, 1)))
        candidate = {**best, knob.key: knob.ladder[j]}
        value = single_run(search, task, candidate, episodes, 10_000 * (search.runs + 1))
        print(f"  greedy: {describe(candidate, state.defaults)} {value:.3f} vs {score:.3f}", flush=True)
        if value > score:
            best, score = candidate, value
    search.final, search.claimed = best, score - base


def random_search(search: Search, task: str, state: Any, episodes: int, budget_s: float, rng: random.Random) -> None:
    best = dict(state.defaults)
    base = score = single_run(search, task, best, episodes, 10_000)
    while search.spent_s < budget_s:
        candidate = {k.key: rng.choice(k.ladder) for k in state.knobs}
        value = single_run(search, task, candidate, episodes, 10_000 * (search.runs + 1))
        if value > score:
            best, score = candidate, value
    search.final, search.claimed = best, score - base


def campaign(search: Search, task: str, steps: int, budget: str) -> None:
    spec = search.root / "goal.toml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(f'[campaign]\nname = "discovery"\ngoal = "Make the {task} task learn faster per episode consumed"\n'
                    f"steps_per_run = {steps}\nseeds = 2\nmax_iterations = 2\n")
    _researcher(search.root, "campaign", "start", str(spec), "--budget", budget, timeout=parse_duration(budget) + 3600)
    rec = record.load(search.root / "studies", "discovery")
    assert rec is not None and rec.discovery is not None
    d = rec.discovery
    search.cpu_h = sum(c.cpu_hours for c in rec.claims)
    search.final = d.incumbent
    combines = [t for t in d.tests if t.kind == "combine" and t.held]
    search.claimed = d.verified.diff if d.verified else (combines[-1].diff if combines else 0.0)


def referee(search: Search, task: str, defaults: dict[str, Any], seeds: int, steps: int, seed_base: int) -> stats.Estimate:
    """The final configuration against the settings on fresh paired seeds, per episode consumed."""
    if search.final == defaults:
        return stats.Estimate(0.0, 0.0, seeds)
    design = Design(task=task, arms=[{"name": "settings", "overrides": defaults},  # type: ignore[list-item]
                                     {"name": "found", "overrides": search.final}])  # type: ignore[list-item]
    summary = _study(search, f"{search.name}-referee", design, seeds, steps, seed_base)
    study = summary.study if summary else None
    if study is None or len(study.arms) < 2:
        return stats.Estimate(math.nan, math.inf, 0)
    by_name = {a.name.split("-", 1)[-1]: a for a in study.arms}
    control, found = by_name["settings"], by_name["found"]
    return stats.compare_arms(dict(zip(found.seeds, found.scores["episode"], strict=True)),
                              dict(zip(control.seeds, control.scores["episode"], strict=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", default="20m", help="each strategy's running time (greedy and random: its CPU)")
    parser.add_argument("--referee-seeds", type=int, default=10)
    parser.add_argument("--task", default="letters")
    parser.add_argument("--steps", type=int, default=8, help="steps a run at the task's own batch size")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-discovery-"))
    state = discover.start(goal.read(f"Make the {args.task} task learn faster", sorted(catalog.examples(EXAMPLES))),
                           EXAMPLES, 0.02)
    episodes = args.steps * episodes_per_step(state.defaults)
    budget_s = parse_duration(args.budget)  # every strategy's running time (the campaign's budget is the same measure)
    rng = random.Random(2026)
    searches = {name: Search(name, out / name) for name in ("campaign", "greedy", "random")}
    print(f"bench_discovery: {args.task}, {args.budget} of running time each, {episodes} episodes a run, "
          f"out {out}", flush=True)
    campaign(searches["campaign"], args.task, args.steps, args.budget)
    greedy(searches["greedy"], args.task, state, episodes, budget_s, rng)
    random_search(searches["random"], args.task, state, episodes, budget_s, rng)
    spent = sum(s.cpu_h for s in searches.values())
    gains = {}
    for k, (name, search) in enumerate(searches.items()):
        gains[name] = referee(search, args.task, state.defaults, args.referee_seeds, args.steps, 900_000 + 10_000 * k)
        print(f"{name}: {describe(search.final, state.defaults)} claimed {search.claimed:+.3f}, "
              f"referee {gains[name].text()} ({search.runs or '-'} single runs, {search.cpu_h:.2f} CPU-h)", flush=True)
    total = sum(s.cpu_h for s in searches.values())
    print(f"referee: {total - spent:.2f} CPU-h")
    print("RESULT " + " ".join(f"{n}_gain={gains[n].mean:.3f} {n}_claimed={searches[n].claimed:.3f}" for n in searches)
          + f" cpu_hours={total:.2f}")


if __name__ == "__main__":
    main()
