"""write_report: the study's answer with its evidence (numbers per configuration, plots), the
hypotheses as written before running, negative results, the steps the offline planner took over from
the LLM planner, and the budget used."""

from __future__ import annotations

import datetime as dt
import tomllib

from researcher.evidence import analysis, factorial, heldout_noise, run_table, window
from researcher.evidence.analysis import AXES, AXIS_TEXT, AXIS_UNIT
from researcher.findings import verdicts
from researcher.findings.records import (
    Cell,
    Comparison,
    Evidence,
    IterationPlan,
    IterationSummary,
    PlanFile,
    SequentialDesign,
)
from researcher.planner.schema import PlannerError
from researcher.runs import record as runs
from researcher.session.context import StudyContext
from researcher.study import coupling, events
from researcher.study import files as studyfiles
from researcher.study.layout import StudyLayout
from researcher.study.state import Phase, StudyState, study_framing, study_options, summaries
from researcher.types.settings import StudyOptions
from researcher.types.usage import LLMUsage, add_usage, new_usage
from swarm import box
from swarm.atomic import write_atomic


def write(state: StudyState, ctx: StudyContext) -> StudyState:
    usage = state.get("llm") or new_usage()
    # A state from before pooled evidence: recompute it from the runs on disk (else "No answer").
    min_effect = study_options(state).min_effect
    history = analysis.backfill(summaries(state), ctx.layout, min_effect)
    framing = study_framing(state)
    phase = state.get("phase")
    final_phase: Phase = "stopped" if ctx.stop_requested() else ("failed" if phase == "failed" else "done")
    if framing is None:
        answer, caveats = "No answer: the topic could not be framed.", state.get("error") or ""
    else:
        answer, caveats = verdicts.verdict(framing.question, history)
        if final_phase == "failed" and not history:
            answer = f"No answer: the study failed before any comparison. {(state.get('error') or '')[:500]}"
        elif history:
            try:
                reply = ctx.planner.report(framing, {
                    "verdict": answer, "caveats": caveats,
                    "iterations": [s.model_dump(include={"iteration", "experiments", "comparison", "plateau", "best"},
                                                exclude_unset=True) for s in history],
                    "effects": [e.dump() for e in (history[-1].study.effects if history[-1].study else [])]})
                usage = add_usage(usage, reply.usage)
                answer, caveats = reply.value.answer, reply.value.discussion
            except PlannerError as exc:
                caveats += f" (The LLM report step failed, so this wording is the offline one: {exc}.)"
        # Whoever worded it: the first sentence names both axes when the question states another.
        answer = verdicts.answer_naming_axes(framing.question, history[-1].study if history else None, answer)
        answer = with_design(answer, history, studyfiles.read_plan(ctx.layout).design,
                              state["budget"]["deadline"] - ctx.clock())
    text = _render(state, history, ctx, answer, caveats, usage, final_phase)
    write_atomic(ctx.layout.report_md, text)
    studyfiles.log(ctx.layout, f"Report written ({final_phase}): {answer}")
    review = run_table.write(ctx.layout, framing.metric if framing else "train/reward_mean")
    run_table.log_to_mlflow(ctx.tracker, ctx.layout, review)
    parent = state.get("mlflow_parent_run")
    if parent:
        # report.md at the run's root with the study's figures/ beside it: the paths it references resolve.
        ctx.tracker.log_files(parent, [ctx.layout.report_md, ctx.layout.log_md])
        figures = ctx.layout.study_dir / "figures"
        if figures.is_dir():
            ctx.tracker.log_files(parent, [figures], "figures")
        if ctx.layout.llm_calls_dir.is_dir():  # includes the decide/report calls made after analysis
            ctx.tracker.log_files(parent, [ctx.layout.llm_calls_dir], "planner_calls")
    question = f"Question: {framing.question}\n\n" if framing else ""
    last = history[-1].study if history else None
    shown = list(last.plots.values()) if last else []
    report = ctx.tracker.report_markdown(state["study_id"], parent, "report.md", shown) if parent else ""
    ctx.tracker.describe_study(state["study_id"], description(final_phase, answer, question + f"Topic: {state['topic']}",
                                                              report or f"Report: {ctx.layout.report_md}"))
    ctx.say("report", path=str(ctx.layout.report_md), answer=answer, phase=final_phase)
    return {"phase": final_phase, "llm": usage}


def with_design(answer: str, history: list[IterationSummary], design: SequentialDesign | None, left_s: float) -> str:
    """``answer`` followed by what the study's size says of it: the pilot's sizing where it said the budget
    cannot decide and the study has not settled (the Answer repeats what the study said as soon as it knew),
    or that a settled question ended the study before its budget."""
    c = history[-1].comparison if history else None
    if design is None or c is None or c.look is None:
        return answer
    settled = verdicts.settled(verdicts.classify(c.diff, c.hw, history[-1].study.min_effect if history[-1].study else 0.0))
    if settled and left_s > 60:
        return (f"{answer} Settled at look {c.look} of {design.looks}: the study ended early, with about "
                f"{left_s / 60:.0f} minutes of its budget left.")
    if design.reachable is False and not settled and design.sizing not in answer:
        return f"{answer} {design.sizing}"
    return answer


def looks_section(history: list[IterationSummary], design: SequentialDesign | None) -> list[str]:
    """Every look at the data: its seeds, boundary, adjusted and plain intervals and what it decided."""
    rows = [(s.iteration, s.comparison) for s in history if s.comparison is not None and s.comparison.look]
    if design is None or not rows:
        return []
    out = ["## Looks", "",
           f"Registered before the first run: up to {design.looks} looks, {design.spending} alpha spending of "
           f"{design.alpha:g} for a false-positive rate at or below {design.target:g}; the pilot "
           f"({design.pilot_seeds} seeds an arm) spends none and sizes the study. {design.sizing}", "",
           "| look | iteration | pairs | information | boundary z | interval (adjusted) | plain 95% | decided |",
           "|---|---|---|---|---|---|---|---|"]
    min_effect = history[-1].study.min_effect if history[-1].study else 0.0
    for iteration, c in rows:
        adjusted = f"{c.diff:+.3f} ± {c.hw:.3f}" if c.hw is not None else f"{c.diff:+.3f} (pilot: no decision)"
        plain = f"± {c.hw95:.3f}" if c.hw95 is not None else "n/a"
        fraction = f"{c.fraction:.2f}" if c.fraction is not None else "pilot"
        z = f"{c.boundary_z:.3f}" if c.boundary_z is not None and c.fraction is not None else "∞"
        out.append(f"| {c.look} | {iteration} | {c.seeds} | {fraction} | {z} | {adjusted} | {plain} | "
                   f"{verdicts.classify(c.diff, c.hw, min_effect)} |")
    return [*out, ""]


HEADLINE_CHARS = 100  # one line of MLflow's collapsed description box (a 1400 px wide window, the chat open)


def description(phase: str, answer: str, *rest: str) -> str:
    """The experiment's description (Markdown): the answer's headline on the first line, which is all MLflow
    shows above the runs until the box is expanded, then the whole answer and ``rest``, a paragraph each."""
    whole = " ".join(answer.split())
    first = f"Answer ({phase}): "
    head = headline(whole, HEADLINE_CHARS - len(first))
    return "\n\n".join([first + head, *([whole] if head != whole else []), *rest])


def headline(text: str, limit: int) -> str:
    """``text`` up to its first sentence end or dash, cut at a word to ``limit`` characters (with "…")."""
    ends = [i for i in (text.find(". "), text.find(" — ")) if i > 0]
    head = text[:min(ends) + (text[min(ends)] == ".")] if ends else text
    if len(head) <= limit:
        return head
    return head[:limit - 1].rsplit(" ", 1)[0].rstrip(",;:") + "…"


def _render(state: StudyState, history: list[IterationSummary], ctx: StudyContext, answer: str, caveats: str,
            usage: LLMUsage, phase: str) -> str:
    framing = study_framing(state)
    plan = studyfiles.read_plan(ctx.layout)
    records = runs.all_records(ctx.layout.runs_dir)
    out = [f"# Study {state['study_id']}", "",
           f"**Topic:** {state['topic']}  ", f"**Question:** {framing.question if framing else 'n/a'}  ",
           f"**Status:** {phase} · written {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}", "",
           "## Answer", "", answer, ""]
    last = history[-1].study if history else None
    if last:
        out += evidence_section(last) + factorial.effects_section(last)
    out += looks_section(history, plan.design)
    for summary in history:
        out += _iteration_section(summary, plan.iteration(summary.iteration))
    out += ["## Discussion", "", caveats, "", *noise_lines(ctx.layout, plan, history, study_options(state)),
            *takeover_section(ctx.layout), *unboxed_section(ctx, state), "## Runs", "",
            "| run key | experiment | seed | status | steps | client restarts |", "|---|---|---|---|---|---|"]
    for r in records:  # restarts after a client failed; a client topped up with more episodes is no failure
        out.append(f"| {r.key} | {r.experiment} | {r.seed} | {r.status} | {r.last_step}/{r.target_step - r.base_step} "
                   f"| {r.client_restarts} |")
    decision = state.get("decision") or {"action": "n/a", "reason": ""}
    out += ["", "## Budget", "",
            f"- Runs launched: {sum(1 for r in records if r.launches)} (max {state['budget']['max_runs']})",
            f"- Iterations: {state.get('iteration', 0)}; last decision: {decision.get('action', 'n/a')} — "
            f"{decision.get('reason', '')}",
            f"- Planner LLM: {usage['calls']} calls, {usage['prompt_tokens'] + usage['completion_tokens']} tokens, "
            f"${usage['cost_usd']:.4f}",
            f"- Deadline: {dt.datetime.fromtimestamp(state['budget']['deadline'], dt.UTC).isoformat(timespec='seconds')}",
            "", f"Everything is in MLflow experiment `{state['study_id']}` (`researcher ui`); the dated log is "
                "LOG.md and the plan (hypotheses written before the runs) is plan.json.", ""]
    return "\n".join(out)


def noise_lines(layout: StudyLayout, plan: PlanFile, history: list[IterationSummary],
                options: StudyOptions) -> list[str]:
    """How the last analysed iteration's arms drew their sampling noise (``researcher.study.coupling``), and
    how much noise one held-out round carries (``researcher.evidence.heldout_noise``)."""
    if not history:
        return []
    folders = [layout.experiment_dir(e.name) for e in plan.iteration(history[-1].iteration).experiments]
    configs = {f.name: tomllib.loads((f / "config.toml").read_text()) for f in folders if (f / "config.toml").is_file()}
    sds = heldout_noise.measured(layout.run_dir(r.iteration, r.trial) for r in runs.all_records(layout.runs_dir))
    return [*([coupling.describe(configs), ""] if configs else []),
            *([heldout_noise.describe(sds, options.min_effect, options.eval_samples), ""] if sds is not None else [])]


def unboxed_section(ctx: StudyContext, state: StudyState) -> list[str]:
    """A study allowed to run LLM-written code without the OS sandbox (``--allow-unboxed``) on a machine
    that could not build it says so; nothing otherwise."""
    missing = box.missing()
    if missing is None or ctx.planner.name == "offline" or not study_options(state).allow_unboxed:
        return []
    return ["## Containment", "", f"LLM-written study code ran **unboxed** (`--allow-unboxed`): {missing}. It had "
            "only the static import check, a clean environment and resource limits.", ""]


def takeover_section(layout: StudyLayout) -> list[str]:
    """The steps the offline planner took over from the LLM planner and why (the study's ``takeover`` events,
    every session's); nothing when the LLM answered every step."""
    taken = [e for e in events.read_events(events.events_path(layout)) if e.get("kind") == "takeover"]
    if not taken:
        return []
    out = ["## Planner takeovers", "", f"The offline planner took {len(taken)} step(s) over from the LLM planner:", ""]
    out += [f"- {e.get('step')} at {dt.datetime.fromtimestamp(e['ts'], dt.UTC).isoformat(timespec='seconds')}: "
            f"{e.get('reason')}" for e in taken]
    return [*out, ""]


def _iteration_section(summary: IterationSummary, planned: IterationPlan) -> list[str]:
    """One iteration: its hypotheses as written before running, its table, comparison, plateau and plot."""
    it = str(summary.iteration)
    out = [f"## Iteration {it}", ""]
    for hyp in planned.hypotheses:
        out.append(f"- Hypothesis {hyp.id} (written before running): {hyp.statement} "
                   f"Metric `{hyp.metric}`; expected: {hyp.expected_effect}")
    budgets = [e for e in planned.experiments if e.steps]
    if budgets:
        out.append("- Planned budgets: " + "; ".join(
            f"{e.name} {e.steps} steps, {e.episodes} episodes"
            + (f", held-out every {e.eval_every} steps" if e.eval_every else "") for e in budgets)
            + (f" ({len(planned.seeds)} seeds each, look {planned.look.look})" if planned.look else ""))
    out += ["", f"This iteration alone: area under the `{summary.metric}` curve (mean height over "
                f"{summary.horizon} training steps; per episode and per second over the budgets every run of the "
                "iteration reached) and final reward (mean of the last 5 points), mean ± 95% CI over seeds:", "",
            f"| experiment | {summary.knob} | AUC per step | AUC per episode | AUC per second | final reward "
            "| usable runs | statuses |", "|---|---|---|---|---|---|---|---|"]
    for row in summary.experiments:
        axes = row.axes
        out.append(f"| {row.name} | {row.value} | {_cell(row.auc)} | {_cell(axes.get('episode'))} | "
                   f"{_cell(axes.get('second'))} | {_cell(row.final)} | "
                   f"{len(row.aucs)}/{len(row.statuses)} | {', '.join(row.statuses)} |")
    comparison = summary.own_comparison
    if comparison:
        hw = f" ± {comparison.hw:.3f}" if comparison.hw is not None else ""
        kind = verdicts.classify(comparison.diff, comparison.hw, summary.study.min_effect) if summary.study else None
        out += ["", f"Difference {comparison.better} − {comparison.worse}: {comparison.diff:+.3f}{hw} "
                    f"({kind.lower() if kind else 'clear' if comparison.clear else 'CI includes 0'})."]
    if summary.plateau:
        out += ["", f"Plateau: {summary.plateau}."]
    if summary.plot:
        out += ["", f"![reward curves, iteration {it}]({summary.plot})"]
    out.append("")
    return out


def _cell(cell: Cell | None) -> str:
    if cell is None:
        return "n/a"
    return f"{cell.mean:.3f}" + (f" ± {cell.hw:.3f}" if cell.hw is not None else f" (n={cell.n})")


def evidence_section(study: Evidence) -> list[str]:
    """The whole study's pooled evidence: metric, verdict axis, noise floor and minimum effect, every
    configuration on every measured axis, the comparison behind the answer, and for a sweep the curve."""
    knob, axis, metric = study.knob, study.axis, study.metric
    iterations = sorted({i for r in study.arms for i in r.iterations})
    budgets = ", ".join(f"{AXIS_TEXT[a]} over {study.budgets[a]:.0f} {AXIS_UNIT[a]}" for a in study.measured)
    out = ["## Evidence (whole study)", "",
           f"Seeds of the same configuration are pooled over iterations {', '.join(map(str, iterations))}. "
           f"{study.metric_note} "
           + (study.switch or f"The verdict axis is {AXIS_TEXT[axis]}: {study.axis_why}.")
           + (f" {study.short}" if study.short else ""), "",
           f"- Metric: `{metric}`; areas under its curve {budgets} (mean height; each axis over the budget every run "
           "reached).", f"- Minimum effect: {study.min_effect}"]
    for a in study.measured:
        noise = study.noise_floor[a]
        sd = f"{noise.sd:.4f}" if noise.sd is not None else "not measured"
        out.append(f"- Noise floor {AXIS_TEXT[a]} (pooled within-configuration sd of the AUC): {sd}, from "
                   f"{noise.seeds} seeds in {noise.arms} configurations")
    rows = [r for r in study.arms if r.scored]
    if study.sweep and all(isinstance(r.value, (int, float)) for r in rows):
        rows.sort(key=lambda r: r.value)
    shown = [a for a in AXES if a != "token" or a in study.measured]  # per token: only for a knob that offers it
    header = " | ".join(f"AUC {AXIS_TEXT[a]}" + (" (verdict)" if a == axis else "") for a in shown)
    out += ["", f"| {knob} | experiment | seeds | iterations | {header} | final reward |",
            "|---|---|---|---|" + "---|" * len(shown) + "---|"]
    c = study.comparison
    settled = c is None or (verdicts.resolved(verdicts.classify(c.diff, c.hw, study.min_effect)) and not study.short)
    for r in rows:
        cells = " | ".join(_cell(r.axes.get(a)) for a in shown)
        best = ("" if r.name != study.best else " **best**" if settled else " (leading)")
        out.append(f"| {r.value}{best} | {r.name} | {len(r.aucs)} | {', '.join(map(str, r.iterations))} | "
                   f"{cells} | {_cell(r.final)} |")
    if c:
        out += _comparison_lines(study, c)
    plots = study.plots
    if study.sweep and rows:
        top = next((r for r in rows if r.name == study.best), rows[0])
        resolved = "resolved" if c and settled else "not resolved"
        out += ["", f"Dose-response curve of {knob} ({AXIS_TEXT[axis]}): best {knob}={top.value} with AUC "
                    f"{_cell(top.axes.get(axis))}, {resolved} against the runner-up.", "",
                f"| {knob} | AUC {AXIS_TEXT[axis]} (mean ± 95% CI) | seeds |", "|---|---|---|"]
        out += [f"| {r.value} | {_cell(r.axes.get(axis))} | {len(r.aucs)} |" for r in rows]
        if plots.get("curve"):
            out += ["", f"![dose-response curve of {knob}]({plots['curve']})"]
    if plots.get("axes"):
        out += ["", f"![each arm's runs, mean and 95% band on every axis over its judged window]({plots['axes']})"]
    if plots.get("looks"):
        out += ["", f"![each look's z against its boundary]({plots['looks']})"]
    return [*out, ""]


def _comparison_lines(study: Evidence, c: Comparison) -> list[str]:
    """Best vs runner-up on the verdict axis (what it resolves), then the difference on the other axes."""
    axis, m = study.axis, study.min_effect
    kind = verdicts.classify(c.diff, c.hw, m)
    verdict = {verdicts.Verdict.NO_DIFFERENCE: f"the whole CI lies within ±{m}",
               verdicts.Verdict.BELOW_MINIMUM: f"the 95% CI excludes 0, the estimate is within ±{m}",
               verdicts.Verdict.INCONCLUSIVE: f"the 95% CI includes 0; {verdicts.seeds_text(c, study.noise_floor[axis])}",
               }.get(kind, f"the 95% CI excludes 0, the estimate is beyond ±{m}")
    hw = f" ± {c.hw:.3f}" if c.hw is not None else " (no interval)"
    out = ["", f"Best vs runner-up {AXIS_TEXT[axis]}: {c.better_label} − {c.worse_label} = "
               f"{c.diff:+.3f}{hw} ({kind.lower()}: {verdict})."]
    for a, other in study.axes_compared.items():
        if a != axis:
            ohw = f" ± {other.hw:.3f}" if other.hw is not None else " (no interval)"
            fewest = min((r.rounds.get(a, 0) for r in study.arms if r.scored), default=0)
            registered = "" if a != study.registered_axis else (
                f" — the registered axis, not judged: the thinnest arm has {fewest} "
                f"{window.points_word(study.metric, fewest)} in its window")
            out.append(f"- {AXIS_TEXT[a]}: {other.diff:+.3f}{ohw} "
                       f"({verdicts.classify(other.diff, other.hw, m).lower()}){registered}")
    return out
