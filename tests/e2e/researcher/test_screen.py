"""Open questions (issue #49): "What makes the letters task learn faster?" is framed offline as a screen of
the catalog's knobs in an 8-arm fractional factorial; driven through the graph's own nodes on a real layout,
the screen's one look flags the knob that moved the reward, concludes, and names the confirmations a
campaign runs on fresh seeds. A topic that is neither a knob nor an open question is still refused."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from node_study import finish_trials, node_study

from researcher.findings.records import Effect
from researcher.planner import screen
from researcher.planner.offline import OfflinePlanner
from researcher.planner.schema import TopicNotMappable
from researcher.study import files as studyfiles
from researcher.types.settings import StudyOptions

QUESTION = "What makes the letters task learn faster?"


def test_an_open_question_is_framed_as_a_balanced_fractional_factorial() -> None:
    planner = OfflinePlanner(["letters", "digits"])
    framing = planner.frame(QUESTION, "").value
    names = [f.name for f in framing.factors]
    assert screen.is_screen(framing) and len(names) == 7 and "lr" in names and "group_size" not in names
    assert "fractional factorial of 8 arms" in framing.question and framing.task == "letters"
    plan = planner.plan(framing, {"iteration": 1, "topic": QUESTION}).value
    arms = [e.overrides for e in plan.experiments]
    assert plan.shape == "factorial" and len(arms) == 8 and len({tuple(a.items()) for a in arms}) == 8
    for f in framing.factors:  # every knob at each level in half the arms
        assert sorted(a[f.name] == f.levels[1] for a in arms) == [False] * 4 + [True] * 4
    for a, b in itertools.combinations(framing.factors, 2):  # main-effect columns are orthogonal
        agree = sum((x[a.name] == a.levels[1]) == (x[b.name] == b.levels[1]) for x in arms)
        assert agree == 4, (a.name, b.name)
    assert len(screen.arms(framing.factors[:3])) == 8 and len(screen.arms(framing.factors[:2])) == 4
    with pytest.raises(TopicNotMappable, match="cannot map"):
        planner.frame("Is the moon relevant to training?", "")


def test_the_screen_flags_the_knob_that_moves_the_reward_and_names_its_confirmation(tmp_path: Path) -> None:
    options = StudyOptions(seeds=2, max_iterations=3)
    ctx, state = node_study(tmp_path, "screen", QUESTION, options, run_s=30.0, runs_launched=0, budget_s=3600)
    from researcher.session.nodes import analyze, decide, plan_experiments, write_client

    state |= plan_experiments.plan_iteration(state, ctx)  # type: ignore[arg-type]
    assert len(state["trials"]) == 16, state.get("error")
    state |= write_client.write(state, ctx)  # type: ignore[arg-type]
    overrides = {e.name: e.overrides for e in studyfiles.read_plan(ctx.layout).iteration(1).experiments}
    # lr 3e-3 learns 0.2 faster; temperature 1.3 a resolved 0.01 slower, below the minimum of interest (0.02);
    # every other knob changes nothing; a seed's noise is ±0.01.
    finish_trials(state, lambda t: 0.3 + (0.2 if overrides[t["experiment"]]["lr"] > 1e-3 else 0.0)
                  - (0.01 if overrides[t["experiment"]]["temperature"] > 1 else 0.0) + 0.01 * (t["seed"] % 2))
    state |= analyze.analyze(state, ctx)  # type: ignore[arg-type]
    effects = {e.name: e for e in (Effect.model_validate(e) for e in state["iterations"][-1]["study"]["effects"])}
    assert effects["temperature"].resolved and abs(effects["temperature"].estimate + 0.01) < 1e-9
    assert [e.name for e in screen.flagged(list(effects.values()), 0.02)] == ["lr"]
    state |= decide.decide(state, ctx)  # type: ignore[arg-type]
    assert state["decision"]["action"] == "conclude" and "the screen flags lr (+0.200" in state["decision"]["reason"]
    framing = OfflinePlanner(["letters"]).frame(QUESTION, "").value
    assert screen.confirmations(framing, list(effects.values()), 0.02) == [
        ("Does lr = 0.003 make the letters task learn faster than lr = 0.0003?", "yes")]


def test_a_campaign_question_is_screened_first_and_each_flagged_knob_becomes_a_claim_on_fresh_seeds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The campaign side: the screen's ended study (driven through the nodes as above) adds one claim per
    flagged knob, once, with seeds the screen never used, kept in campaign.json across a reload."""
    from researcher.campaign import ledger, runner
    from researcher.campaign.record import CampaignRecord, ClaimRecord
    from researcher.campaign.spec import CONFIRM_SEED_BASE, parse
    from researcher.session.nodes import analyze, decide, plan_experiments, write_client

    ctx, state = node_study(tmp_path, "open-c1", QUESTION, StudyOptions(seeds=2), run_s=30.0, runs_launched=0,
                            budget_s=3600)
    state |= plan_experiments.plan_iteration(state, ctx)  # type: ignore[arg-type]
    state |= write_client.write(state, ctx)  # type: ignore[arg-type]
    overrides = {e.name: e.overrides for e in studyfiles.read_plan(ctx.layout).iteration(1).experiments}
    finish_trials(state, lambda t: 0.5 - (0.1 if overrides[t["experiment"]]["temperature"] > 1 else 0.0)
                  + 0.01 * (t["seed"] % 2))
    state |= analyze.analyze(state, ctx)  # type: ignore[arg-type]
    state |= decide.decide(state, ctx)  # type: ignore[arg-type]
    state["phase"] = "done"

    text = f'[campaign]\nname = "open"\nquestion = "{QUESTION}"\nsteps_per_run = 5\n'
    spec = parse(text).expanded([])
    assert [(c.topic, c.expect) for c in spec.claim] == [(QUESTION, "screen")]
    rec = CampaignRecord(name="open", budget_s=3600, study_deadline=0, claims=[ClaimRecord(index=0, study_id="open-c1")])
    monkeypatch.setattr(runner, "read_state", lambda layout: state)
    studies, artifacts = tmp_path / "studies", tmp_path / "artifacts"
    for _ in range(2):  # a second read of the ended screen adds nothing more
        runner._refresh(spec, rec, rec.claims[0], studies, artifacts)
    assert rec.screened and [c.study_id for c in rec.claims] == ["open-c1", "open-c2"]
    reloaded = parse(text).expanded(CampaignRecord.model_validate_json(rec.model_dump_json()).added)
    confirm = reloaded.claim[1]
    assert (confirm.topic, confirm.expect) == (
        "Does temperature = 1.3 make the letters task learn faster than temperature = 0.7?", "no")
    argv = runner._session_argv(reloaded, rec, rec.claims[1], 600, studies, artifacts)
    assert argv[argv.index("--seed-base") + 1] == str(CONFIRM_SEED_BASE) and confirm.topic in argv
    assert argv[argv.index("--steps-per-run") + 1] == "5"
    lines = ledger.scorecard(reloaded, rec)
    assert lines[0].startswith("c1 expect 'screen': flagged 1 knob(s)") and lines[-1].startswith("RESULT claims=1 ")


@pytest.mark.study
@pytest.mark.timeout(5400)
def test_an_open_question_on_letters_is_screened_then_confirmed_on_fresh_seeds(cli, tmp_path: Path) -> None:
    """Acceptance (#49): a campaign from an open question on letters runs its screen through the CLI, adds
    a claim for each knob the screen flags, and runs the confirmations on seeds the screen never used."""
    import json

    from researcher.runs import record as runs

    file = tmp_path / "open.toml"
    file.write_text(f'[campaign]\nname = "open"\nquestion = "{QUESTION}"\nsteps_per_run = 10\nseeds = 2\n')
    done = cli.run("campaign", "start", str(file), "--budget", "45m", *cli.dirs, timeout=4800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rec = json.loads((cli.studies / "open" / "campaign.json").read_text())
    assert rec["screened"] and rec["claims"][0]["phase"] == "done", rec
    assert len(rec["claims"]) >= 2, "the screen flagged nothing: " + (cli.studies / "open-c1" / "LOG.md").read_text()
    screen_seeds = {r.seed for r in runs.all_records(cli.artifacts / "open-c1" / "runs")}
    confirm_seeds = {r.seed for c in rec["claims"][1:] for r in runs.all_records(cli.artifacts / c["study_id"] / "runs")}
    assert len(screen_seeds) == 2 and confirm_seeds and not screen_seeds & confirm_seeds
    print(done.stdout[-3000:])
