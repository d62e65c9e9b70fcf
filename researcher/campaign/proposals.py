"""An LLM's hypotheses beyond the catalog for a discovery campaign's round (``Discovery.propose``).

Where an LLM is configured, each round's screen is preceded by one call (``prompts/propose_hypotheses.md``):
the model sees the goal, the incumbent, the screen's knobs and levels and every test so far, and may name a
few server config changes of its own. What it names is checked before anything runs: the key must be a
server config key the campaign may move (not an engine, the run's length, its seed or its reward), and the
incumbent with the change must pass the server's own validation (``swarm serve --check``, in one call:
the researcher does not import the server). What passes joins the round and is confirmed like the
screen's flags, within the same error budget; what fails is named in the ledger with why. Offline, or when
the call fails, the catalog alone is used.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from researcher.campaign.discovery import Discovery, Proposal, describe
from researcher.campaign.goal import Goal
from researcher.findings.records import JsonObject
from researcher.planner import catalog
from researcher.planner.schema import PlannerError, ProposedChange
from researcher.study.files import dumps_toml
from researcher.types.settings import ResearcherSettings

__all__ = ["FIXED_KEYS", "Proposer", "check", "context", "llm_proposer", "note", "vet"]

# What a hypothesis may not move: what the run is (model, engines, placement), how long it runs, its seed,
# its reward, and how the comparison itself draws noise.
FIXED_KEYS = frozenset({"model", "engine", "trainer", "workers", "ray_address", "weight_transfer", "generator_gpus",
                        "trainer_gpus", "gpu_memory_utilization", "device", "dtype", "decode_cache", "deterministic",
                        "coupled", "max_steps", "seed", "random_reward", "recipe", "checkpoint_every", "retention",
                        "retention_export_dir"})
CHECK_TIMEOUT_S = 120.0

# The round's hypotheses that passed the checks, and one line per refused one.
Proposer = Callable[[Discovery], tuple[list[Proposal], list[str]]]


def context(d: Discovery) -> JsonObject:
    """What the model is shown of the campaign: round, incumbent, the screen's levels and every test."""
    return {"round": d.round, "incumbent": d.incumbent, "changed_from_defaults": describe(d.incumbent, d.defaults),
            "screen": {key: levels for key, levels in d.screen_factors()},
            "knob_levels": {k.key: k.ladder for k in [*d.knobs, *d.extra_knobs]},
            "tests": [{"round": t.round, "kind": t.kind, "changes": {c.knob: c.value for c in t.changes},
                       "diff": round(t.diff, 4), "low": round(t.low, 4), "high": round(t.high, 4), "held": t.held}
                      for t in d.tests]}


def vet(answer: list[ProposedChange], d: Discovery, task_config: dict[str, Any]) -> tuple[list[Proposal], list[str]]:
    """The model's ``answer`` as proposals that pass the checks (module docstring), and why each other one
    was refused."""
    refused: list[str] = []
    candidates: list[Proposal] = []
    for change in answer:
        shown = f"{change.key} = {catalog.show(change.value)}"
        if change.key not in catalog.CONFIG_KEYS:
            refused.append(f"{shown}: not a server config key")
        elif change.key in FIXED_KEYS:
            refused.append(f"{shown}: the campaign does not move {change.key}")
        else:
            current = d.incumbent.get(change.key, task_config.get(change.key))
            candidates.append(Proposal(knob=change.key, value=change.value, current=current, why=change.why))
    problems = check([{**task_config, **d.incumbent, p.knob: p.value} for p in candidates])
    passed = []
    for proposal, problem in zip(candidates, problems, strict=True):
        if problem:
            refused.append(f"{proposal.knob} = {catalog.show(proposal.value)}: {problem}")
        else:
            passed.append(proposal)
    return passed, refused


def check(configs: list[dict[str, Any]]) -> list[str | None]:
    """Each config's problem as ``swarm serve --check`` states it (None: valid), in one call."""
    if not configs:
        return []
    with tempfile.TemporaryDirectory(prefix="proposals-") as tmp:
        paths = [Path(tmp) / f"proposal-{i}.toml" for i in range(len(configs))]
        for path, config in zip(paths, configs, strict=True):
            path.write_text(dumps_toml(config))
        argv = [sys.executable, "-m", "swarm.cli", "serve", "--check"]
        for path in paths:
            argv += ["--config", str(path)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)
    said = {line.split(": ", 1)[0]: line.split(": ", 1)[1] for line in (done.stdout + done.stderr).splitlines()
            if ": " in line}
    return [None if said.get(str(path)) == "ok" else said.get(str(path), f"swarm serve --check exited {done.returncode}")
            for path in paths]


def llm_proposer(settings: ResearcherSettings, goal: Goal, task_config: dict[str, Any]) -> Proposer | None:
    """The round's proposer where an LLM is configured (None offline)."""
    if settings.llm is None:
        return None
    from researcher.planner.llm import LLMPlanner
    from researcher.planner.prompts import PromptLibrary

    planner = LLMPlanner(settings.llm, PromptLibrary(settings.prompts_root))

    def propose(d: Discovery) -> tuple[list[Proposal], list[str]]:
        try:
            reply = planner.propose(goal.text, context(d), catalog.describe_config_keys())
        except PlannerError as exc:
            return [], [f"the LLM proposed nothing ({exc})"]
        return vet(reply.value.hypotheses, d, task_config)

    return propose


def note(round_: int, taken: list[Proposal], refused: list[str]) -> str:
    """The ledger's line for a round's proposals."""
    said = "; ".join(f"{p.knob} = {catalog.show(p.value)} ({p.why})" if p.why else f"{p.knob} = {catalog.show(p.value)}"
                     for p in taken) or "nothing"
    out = f"Round {round_}: the LLM's hypotheses beyond the catalog, confirmed after the screen's flags: {said}."
    return out + (f" Refused: {'; '.join(refused)}." if refused else "")
