"""validate: compile the client, check its imports, then smoke-run a few episodes against a real
swarm server.

The import check (``researcher.sandbox.check_client``) runs before any of the code does: a client
importing ``subprocess`` never reaches the smoke run. A failure records the error (traceback, the
check's list of violations or the log tail) for the planner's repair round; after ``max_repairs``
failed rounds the study fails with the last error.
"""

from __future__ import annotations

import traceback
from typing import Any

from researcher import sandbox, studyfiles
from researcher.context import StudyContext
from researcher.state import StudyState


def run(state: StudyState, ctx: StudyContext) -> dict[str, Any]:
    if state.get("phase") == "failed":
        return {}  # write_client refused the plan: nothing to validate, the report follows
    plan = studyfiles.read_plan(ctx.layout)["iterations"][str(state["iteration"])]
    first = plan["experiments"][0]["name"]
    folder = ctx.layout.experiment_dir(first)
    client, config = folder / "client.py", folder / "config.toml"
    validation = dict(state.get("validation") or {"attempts": 0, "ok": False, "error": None})
    attempt = validation.get("attempts", 0) + 1
    source = client.read_text()
    error = _compile_error(source, str(client)) or sandbox.check_client(source, client.name)
    if error is None:
        group = min(2, state["options"]["smoke_episodes"])
        server = ctx.settings.servers[0] if ctx.settings.servers else None
        error = ctx.launcher.smoke(client, config, ctx.layout.smoke_dir(state["iteration"], attempt),
                                   episodes=state["options"]["smoke_episodes"], group_size=group,
                                   timeout_s=state["options"]["smoke_timeout_s"], server_url=server)
    if error is None:
        studyfiles.log(ctx.layout, f"Validation attempt {attempt} passed: the client compiled, passed the import "
                                   f"check, and a smoke run of {state['options']['smoke_episodes']} episodes "
                                   "finished on a real server.")
        ctx.say("validated", attempt=attempt, ok=True)
        return {"validation": {"attempts": attempt, "ok": True, "error": None}, "phase": "running"}
    first_line = error.strip().splitlines()[-1] if error.strip() else "unknown error"
    studyfiles.log(ctx.layout, f"Validation attempt {attempt} FAILED: {first_line[:300]}")
    ctx.say("validated", attempt=attempt, ok=False, error=first_line[:200])
    if attempt > state["budget"]["max_repairs"]:
        return {"validation": {"attempts": attempt, "ok": False, "error": error}, "phase": "failed",
                "error": f"the client still failed validation after {attempt} attempts:\n{error[-2000:]}"}
    return {"validation": {"attempts": attempt, "ok": False, "error": error}, "phase": "writing"}


def _compile_error(source: str, filename: str) -> str | None:
    try:
        compile(source, filename, "exec")
    except SyntaxError:
        return "".join(traceback.format_exc(limit=0))
    return None
