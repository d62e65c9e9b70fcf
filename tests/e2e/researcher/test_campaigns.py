"""Campaigns (issue #49): the file refused whole when broken, the next look given to the claim closest to
settling, the ledger and scorecard worded from campaign.json, and a real campaign on letters through
the CLI, SIGKILLed mid-session and resumed (`-m study`): nothing lost, no run launched twice, every claim's looks
and MLflow runs in the ledger, the scorecard's RESULT line, the campaign's MLflow experiment."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support import wait_for

from researcher.campaign import allocate, ledger, spec, standing
from researcher.campaign.record import CampaignRecord, ClaimRecord, LookEntry
from researcher.findings.verdicts import Verdict
from researcher.runs import record as runs

LETTERS_CLAIMS = (
    ("Does a learning rate of 3e-3 beat 3e-5 on letters?", "yes", "a large effect"),
    ("A/A check: do two identical configurations of letters learn at different speeds?", "no meaningful difference",
     "a null"),
    ("Does a KL coefficient of 0.1 slow learning on letters compared with 0?", "yes", "DAPO, arXiv 2503.14476"),
)


def campaign_file(path: Path, name: str, claims: tuple[tuple[str, ...], ...], **knobs: object) -> Path:
    """A campaign file; a claim's optional fourth string is more of its TOML lines (its own knobs)."""
    head = "".join(f"{k} = {json.dumps(v)}\n" for k, v in knobs.items())
    body = "".join(f'\n[[claim]]\ntopic = "{t}"\nexpect = "{e}"\nsource = "{s}"\n{"".join(more)}' for t, e, s, *more in claims)
    path.write_text(f'[campaign]\nname = "{name}"\n{head}{body}')
    return path


def test_a_broken_campaign_file_is_refused_with_where_and_why() -> None:
    good = spec.parse('[campaign]\nname = "c"\nseeds = 2\n[[claim]]\ntopic = "Does lr 3e-3 beat 3e-5?"\nexpect = "Yes"\n'
                      'steps_per_run = 5\n')
    assert good.claim[0].expect == "yes" and good.knobs(0) == {"steps_per_run": 5, "seeds": 2}
    for text, words in (
        ('[campaign]\nname = "c"\n', "a campaign needs [[claim]] entries, an open `question` or a `goal`"),
        ('[campaign]\nname = "c"\n[[claim]]\ntopic = "Does lr 3e-3 beat 3e-5?"\nexpect = "screen"\n',
         "is the campaign's own; a claim expects"),
        ('[campaign]\nname = "c"\ngoal = "Make letters learn faster"\n[[claim]]\ntopic = "Does lr 3e-3 beat 3e-5?"\n'
         'expect = "no"\n', "a `goal` campaign writes its own claims"),
        ('[campaign]\nname = "c"\n[[claim]]\ntopic = "Does lr 3e-3 beat 3e-5?"\nexpect = "maybe"\n', "claim.0.expect"),
        ('[campaign]\nname = "c"\n[[claim]]\ntopic = "Does lr 3e-3 beat 3e-5?"\nexpect = "no"\nlr = 1\n',
         "claim.0.lr: Extra inputs are not permitted"),
        ('[campaign]\nname = "Bad Name"\n[[claim]]\ntopic = "Does lr 3e-3 beat 3e-5?"\nexpect = "no"\n', "invalid study id"),
        ('[campaign]\nname = "c"\n[[claim]]\ntopic = "Does lr 3e-3 beat 3e-5?"\nexpect = "no"\nshare = 0.7\n'
         '[[claim]]\ntopic = "Does kl 0.1 slow it?"\nexpect = "no"\nshare = 0.7\n', "add up to 1.4"),
        ("[campaign\n", "is not TOML"),
    ):
        with pytest.raises(ValueError, match=re.escape(words)):
            spec.parse(text)


def _claim(index: int, looks: list[tuple[int, int | None]] = (), phase: str = "parked", spent: float = 0.0) -> ClaimRecord:
    return ClaimRecord(index=index, study_id=f"c-c{index + 1}", phase=phase, spent_s=spent,
                       looks=[LookEntry(look=i + 1, seeds=s, needed_seeds=n, verdict="Inconclusive")
                              for i, (s, n) in enumerate(looks)])


def test_the_next_look_goes_to_the_open_claim_closest_to_settling() -> None:
    sized_far, sized_near = _claim(0, [(3, 12)]), _claim(1, [(3, 5)])
    unsized, fresh = _claim(2, [(3, None)]), _claim(3, phase="not started")
    assert allocate.next_claim([sized_far, sized_near, unsized, fresh], [None] * 4, 3600) is fresh  # its pilot first
    assert allocate.next_claim([sized_far, sized_near, unsized], [None] * 4, 3600) is sized_near
    assert allocate.next_claim([sized_far, unsized], [None] * 4, 3600) is sized_far  # unknown sizing ranks last
    # A settled (ended) claim gets nothing more; nor one that spent its share of the budget.
    done = _claim(1, [(3, 5), (5, 5)], phase="done")
    assert allocate.next_claim([sized_far, done], [None, None], 3600) is sized_far
    spent = _claim(0, [(3, 4)], spent=1800)
    assert allocate.next_claim([spent, _claim(1, [(3, 9)])], [0.5, None], 3600).index == 1
    assert allocate.next_claim([done], [None], 3600) is None


def test_the_ledger_and_scorecard_word_every_claim_from_the_record() -> None:
    parsed = spec.parse('[campaign]\nname = "reps"\n'
                        '[[claim]]\ntopic = "Does lr 3e-3 beat 3e-5 on letters?"\nexpect = "yes"\nsource = "S1"\n'
                        '[[claim]]\ntopic = "Does kl 0.1 slow letters?"\nexpect = "no"\n'
                        '[[claim]]\ntopic = "A/A check on letters"\nexpect = "no meaningful difference"\n')
    first = _claim(0, [(3, 4), (5, 4)], phase="done")
    first.verdict, first.cpu_hours = "Yes", 0.25
    first.looks[-1].mlflow_runs = ["run-a", "run-b"]
    first.looks[-1].diff, first.looks[-1].hw = 0.061, 0.02
    second = _claim(1, [(3, 4), (6, 4)], phase="done")
    second.verdict, second.cpu_hours = "Yes", 0.5
    third = _claim(2, [(3, 25)])
    rec = CampaignRecord(name="reps", budget_s=1800, study_deadline=0, claims=[first, second, third],
                         baselines={"letters": {"lr": 0.003}}, baseline_sources={"letters": ["reps-c1"]})
    lines = ledger.scorecard(parsed, rec)
    assert lines[0].startswith("c1 expect 'yes': Yes · agrees · 5 seeds an arm · 0.25 CPU-h · c-c1")
    assert "disagrees" in lines[1] and "open (Inconclusive at look 1) · -" in lines[2]
    assert lines[-1] == "RESULT claims=3 decisive=2 agree=1 disagree=1 cpu_hours=0.75"
    text = ledger.render(parsed, rec)
    assert "Baseline for letters is now lr=0.003 (settled in reps-c1)" in text
    assert "| 2 | 5 | Inconclusive | +0.061 ± 0.020 | - | run-a, run-b |" in text
    assert text.count("## c") == 3


def test_a_campaign_with_a_claim_the_planner_cannot_map_writes_nothing(cli, tmp_path: Path) -> None:
    bad = campaign_file(tmp_path / "c.toml", "refused", (LETTERS_CLAIMS[0], ("Is the moon relevant to letters?", "yes", "")))
    done = cli.run("campaign", "start", str(bad), "--budget", "5m", *cli.dirs, timeout=120)
    assert done.returncode == 2 and "Is the moon relevant to letters?" in done.stdout and "cannot map" in done.stdout
    assert not (cli.studies / "refused").exists() and not list(cli.studies.glob("refused-c*"))
    broken = tmp_path / "broken.toml"
    broken.write_text('[campaign]\nname = "x"\n[[claim]]\ntopic = "Does lr 3e-3 beat 3e-5?"\nexpect = "maybe"\n')
    done = cli.run("campaign", "start", str(broken), "--budget", "5m", *cli.dirs, timeout=120)
    assert done.returncode == 2 and "claim.0.expect" in done.stdout and not (cli.studies / "x").exists()
    # A goal the planner cannot map exits 2, saying what it understood.
    done = cli.run("campaign", "start", "--goal", "Make it learn faster per training step", "--budget", "5m",
                   "--name", "nogoal", *cli.dirs, timeout=120)
    assert done.returncode == 2 and "names no task (understood: task (none named), objective its held-out reward " \
        "AUC per training step)" in " ".join(done.stdout.split()), done.stdout
    assert not (cli.studies / "nogoal").exists()


def _run_killed_and_resumed(cli, tmp_path: Path, name: str, claims: tuple[tuple[str, ...], ...], budget: str,
                            **knobs: object) -> tuple[list[str], dict]:
    """Start the campaign, SIGKILL its researcher once a claim's run trains, resume it to the end."""
    file = campaign_file(tmp_path / f"{name}.toml", name, claims, **knobs)
    proc = cli.popen("campaign", "start", str(file), "--budget", budget, *cli.dirs, log=tmp_path / "start.log")
    try:
        wait_for(lambda: any(r.last_step >= 1 for r in runs.all_records(cli.artifacts / f"{name}-c1" / "runs")),
                 360, what="a run of the first claim training", proc=proc, interval=0.5)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    killed = json.loads((cli.studies / name / "campaign.json").read_text())
    assert killed["session"] == {"claim": 0, "started": killed["session"]["started"]}  # the session it was in
    resumed = cli.run("campaign", "resume", name, *cli.dirs, timeout=3600)
    assert resumed.returncode == 0, (tmp_path / "start.log").read_text()[-2000:] + resumed.stdout + resumed.stderr
    return resumed.stdout.strip().splitlines(), json.loads((cli.studies / name / "campaign.json").read_text())


def _check_nothing_twice(cli, name: str, claims: int) -> list[runs.RunRecord]:
    everything = []
    for index in range(claims):
        records = runs.all_records(cli.artifacts / f"{name}-c{index + 1}" / "runs")
        assert records and all(r.launches == 1 for r in records), [(r.key, r.launches) for r in records]
        everything += records
    return everything


@pytest.mark.study
@pytest.mark.timeout(1500)
def test_a_campaign_sigkilled_mid_session_resumes_and_ends_with_its_ledger_and_scorecard(cli, tmp_path: Path) -> None:
    """Two letters claims of a seed an arm and 3 steps a run (too few points for a verdict: this checks the
    campaign's mechanics, the 30-minute test below its answers): the first at most two looks, the second one
    (its pilot is its only look). Four to seven minutes on 2 cores, so `-m study` (issue #51's CI time): the
    default run keeps the campaign's parts (the file, the allocation, the ledger, the scheduled resume, a
    campaign study's baseline and park) and the study's own SIGKILL and resume (test_crash_resume)."""
    claims = (LETTERS_CLAIMS[0], (*LETTERS_CLAIMS[1], "max_iterations = 1\n"))
    lines, rec = _run_killed_and_resumed(cli, tmp_path, "camp", claims, "20m", steps_per_run=3, seeds=1,
                                         max_iterations=2, max_runs=4)
    records = _check_nothing_twice(cli, "camp", 2)
    assert rec["ended"] and rec["session"] is None and all(c["phase"] == "done" for c in rec["claims"])
    assert [len(c["looks"]) for c in rec["claims"]] == [2, 1]  # c1 parked after its pilot, the campaign resumed it
    assert rec["claims"][0]["sessions"] >= 2 and rec["claims"][0]["spent_s"] > 0
    assert lines[-1].startswith("ledger: ") and lines[-2].startswith("RESULT claims=2 decisive=")
    assert lines[-4].startswith("c1 expect 'yes': ") and "camp-c1" in lines[-4]
    # The session the kill left either still ran when the campaign resumed (it waited for it) or had parked
    # already (on a loaded machine the resume can come after its pilot's 3 steps): its time is booked either way
    # (spent_s above), and no run launched twice.
    waited = "waiting for the session of camp-c1 a killed campaign left running" in lines[0]
    assert waited or lines[0].split(" ", 1)[1].startswith("c"), lines[:3]
    ledger_md = (cli.studies / "camp" / "ledger.md").read_text()
    run_ids = {r.mlflow_run_id for r in records if r.study_id == "camp-c1"}
    assert any(run_id in ledger_md for run_id in run_ids) and "## c2: A/A check" in ledger_md
    assert "parked" in (cli.studies / "camp-c1" / "LOG.md").read_text()  # the look's park, in the study's own log
    scorecard = cli.run("campaign", "scorecard", "camp", *cli.dirs)
    assert scorecard.returncode == 0 and scorecard.stdout.strip().splitlines()[-1] == lines[-2]
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{cli.artifacts.resolve() / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("campaign-camp")
    claim_runs = {r.data.tags["claim"]: r for r in client.search_runs([experiment.experiment_id])}
    assert sorted(claim_runs) == ["1", "2"] and all(r.info.status == "FINISHED" for r in claim_runs.values())
    assert [claim_runs[c].data.tags["looks_logged"] for c in ("1", "2")] == ["2", "1"]
    assert len(client.get_metric_history(claim_runs["1"].info.run_id, "look/seeds")) == 2
    listed = cli.run("status", *cli.dirs)
    assert "camp-c1" in listed.stdout and "camp-c2" in listed.stdout


@pytest.mark.study
@pytest.mark.timeout(3600)
def test_three_letters_hypotheses_in_30_minutes_survive_a_sigkill(cli, tmp_path: Path) -> None:
    """Acceptance: three hypotheses on letters, --budget 30m, SIGKILL mid-campaign, resume."""
    started = time.monotonic()
    lines, rec = _run_killed_and_resumed(cli, tmp_path, "letters3", LETTERS_CLAIMS, "30m", steps_per_run=20)
    _check_nothing_twice(cli, "letters3", 3)
    assert rec["ended"] and lines[-2].startswith("RESULT claims=3 ")
    assert time.monotonic() - started < 45 * 60
    print("\n".join(lines))


def test_a_scheduled_campaign_resumes_as_a_campaign(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon's job tells a campaign's folder from a study's and runs `researcher campaign resume`."""
    from researcher.operations import scheduler

    studies, artifacts = tmp_path / "studies", tmp_path / "artifacts"
    (studies / "camp").mkdir(parents=True)
    (studies / "camp" / "campaign.json").write_text(json.dumps({"name": "camp", "ended": None}))
    seen: list[list[str]] = []

    def fake_start(argv: list[str], **_: object) -> subprocess.Popen[bytes]:
        seen.append(argv)
        return subprocess.Popen(["true"])

    monkeypatch.setattr(scheduler.stopping, "start_child", fake_start)
    outcome = scheduler.run_scheduled_resume("camp", str(studies), str(artifacts), 60.0)
    assert outcome["outcome"] == "ran" and seen[0][3:6] == ["campaign", "resume", "camp"]
    (studies / "camp" / "campaign.json").write_text(json.dumps({"name": "camp", "ended": "budget spent"}))
    assert scheduler.run_scheduled_resume("camp", str(studies), str(artifacts), 60.0)["outcome"] == "skipped"


def test_a_campaign_study_starts_from_the_baseline_and_parks_after_its_look(tmp_path: Path) -> None:
    """The study side, through the graph's own nodes on a real layout: every arm's config.toml starts from
    ``baseline`` (the arm's own override wins), and after a look that does not conclude, decide parks the
    study (the campaign resumes it) instead of planning the next look at once."""
    import tomllib

    from node_study import finish_trials, node_study

    from researcher.session.nodes import analyze, decide, plan_experiments, write_client
    from researcher.types.settings import StudyOptions

    options = StudyOptions(seeds=2, max_iterations=3, park_after_look=True, baseline={"temperature": 0.7, "lr": 0.5})
    ctx, state = node_study(tmp_path, "camp-c2", "Does a learning rate of 3e-3 beat 3e-5 on letters?", options,
                            run_s=60.0, runs_launched=4, budget_s=3600)
    layout = ctx.layout
    state |= plan_experiments.plan_iteration(state, ctx)  # type: ignore[arg-type]
    state |= write_client.write(state, ctx)  # type: ignore[arg-type]
    configs = {p.parent.name: tomllib.loads(p.read_text()) for p in layout.study_dir.glob("experiments/*/config.toml")}
    assert len(configs) == 2 and all(c["temperature"] == 0.7 for c in configs.values())
    assert sorted(c["lr"] for c in configs.values()) == [3e-5, 3e-3]  # the arms' own lr, not the baseline's
    finish_trials(state, lambda trial: 0.3 + 0.01 * (trial["trial"] % 3))
    state |= analyze.analyze(state, ctx)  # type: ignore[arg-type]
    state |= decide.decide(state, ctx)  # type: ignore[arg-type]
    assert state["decision"]["action"] == "continue" and state["phase"] == "planning"  # the pilot decides nothing
    assert ctx.should_park() == "look 1 done: the campaign decides which hypothesis gets the next seeds"


def test_a_claim_that_asks_for_a_slowdown_is_scored_on_its_own_question(tmp_path: Path) -> None:
    """KL 0.2 learns slower than 0 over two looks: the study answers its Question ("Which of kl_coef = 0.2
    or 0 makes letters learn faster?") with No, the larger learned slower; the claim ("Does a KL coefficient
    of 0.2 slow learning…?") reads Yes, in the look the campaign books and in its ended verdict."""
    from node_study import finish_trials, node_study

    from researcher.session.nodes import analyze, decide, plan_experiments, write_client
    from researcher.types.settings import StudyOptions

    topic = "Does a KL coefficient of 0.2 slow learning on letters compared with 0?"
    options = StudyOptions(seeds=4, max_iterations=2, park_after_look=True)
    ctx, state = node_study(tmp_path, "camp-kl", topic, options, run_s=60.0, runs_launched=6, budget_s=3600)
    for _ in range(2):  # the pilot, then a look that decides
        state |= plan_experiments.plan_iteration(state, ctx)  # type: ignore[arg-type]
        state |= write_client.write(state, ctx)  # type: ignore[arg-type]
        finish_trials(state, lambda trial: (0.30 if "0_2" in trial["experiment"] else 0.40) + 0.002 * (trial["trial"] % 3))
        state |= analyze.analyze(state, ctx)  # type: ignore[arg-type]
        state |= decide.decide(state, ctx)  # type: ignore[arg-type]
    assert standing.study_verdict(state) is Verdict.NO  # the study's own sign: larger minus smaller
    look = standing.latest_look(ctx.layout, state)
    assert look is not None and look.look == 2 and look.verdict == "Yes" and look.better == "kl_coef=0.0"
    assert standing.claim_verdict(state, Verdict.NO) is Verdict.YES
    # the settled finding (KL 0 learns faster) becomes letters' baseline; judged on entropy or answer
    # length instead, the "better" arm is only the higher curve and sets no baseline
    assert standing.winner_settings(state) == {"kl_coef": 0.0}
    state["iterations"][-1]["study"]["metric"] = "train/entropy"
    assert standing.winner_settings(state) is None
