"""write_client: write each experiment's client.py and config.toml (or repair the client after a
failed validation, showing the planner the error).

A plan whose overrides hold a key that is not a config key fails the study before any file is
written or any planner call is made (validate passes a failed study on to the report)."""

from __future__ import annotations

from typing import Any

from researcher import catalog, studyfiles
from researcher.context import StudyContext
from researcher.planner.schema import Framing
from researcher.planner.usage import add_usage, new_usage
from researcher.state import StudyState


def run(state: StudyState, ctx: StudyContext) -> dict[str, Any]:
    framing = Framing.model_validate(state["framing"])
    example = catalog.examples(ctx.settings.examples_root)[framing.task]
    example_source = example.client.read_text()
    plan = studyfiles.read_plan(ctx.layout)["iterations"][str(state["iteration"])]
    try:
        configs = {exp["name"]: studyfiles.server_config(example.config, exp["overrides"])
                   for exp in plan["experiments"]}
    except ValueError as exc:
        studyfiles.log(ctx.layout, f"Iteration {state['iteration']}: the plan is unusable: {exc}")
        return {"phase": "failed", "error": f"the plan of iteration {state['iteration']} is unusable: {exc}"}
    validation = dict(state.get("validation") or {"attempts": 0, "ok": False, "error": None})
    first = ctx.layout.experiment_dir(plan["experiments"][0]["name"]) / "client.py"
    if validation.get("error") and first.is_file():
        reply = ctx.planner.repair_client(first.read_text(), validation["error"], example_source)
        what = f"Repaired the client after validation attempt {validation['attempts']} ({reply.value.notes})."
    else:
        reply = ctx.planner.write_client(framing, example_source, plan["experiments"])
        what = f"Wrote the client for iteration {state['iteration']} ({reply.value.notes or 'no notes'})."
    usage = add_usage(state.get("llm") or new_usage(), reply.usage)
    for exp in plan["experiments"]:
        studyfiles.write_experiment(ctx.layout, exp["name"], reply.value.code, configs[exp["name"]],
                                    exp["hypothesis"])
    studyfiles.log(ctx.layout, what)
    ctx.say("client", iteration=state["iteration"], repaired=bool(validation.get("error")))
    return {"phase": "validating", "llm": usage, "validation": validation}
