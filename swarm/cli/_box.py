"""``swarm run --box``: the same ``swarm run``, started again inside the box (``swarm.box``).

This process never imports the study: it resolves the server's URL and the client token outside
(the state dir and its token files stay outside the box), builds the box's view, and runs
``swarm run`` with the same options inside it. Only the client token goes in, by environment; the
control token never does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from swarm.cli._common import err, fail, server_url

# Taken from this process's environment when set; nothing else goes in.
_INHERITED_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def run_boxed(flags: Any) -> int:
    """Run ``swarm run`` with ``flags`` (``swarm.cli.run.RunFlags``, which imports this module when it
    runs) in the box; its exit code."""
    from swarm.box import BoxPlan, BoxUnavailable, missing, run_boxed_swarm, server_address, writable_run_dir

    why = missing()
    if why:
        fail(f"--box needs an OS sandbox and this machine cannot build one: {why}", 2)
    study, link, box = flags.study, flags.connection, flags.sandbox
    if study.client_file is None or flags.dataset.data is not None:
        fail("--box runs a study CLIENT.py (give it and no --data)", 2)
    client = study.client_file.resolve()
    if not client.is_file():
        fail(f"no study client at {client}", 2)
    run_dir = writable_run_dir(box.box_dir or Path.cwd())
    state_dir = link.state_dir.resolve()
    rewards = study.rewards_out.resolve() if study.rewards_out else None
    inner = ["run", str(client), *_passed_options(study)]
    server = None
    if not study.probe:
        try:
            host, port, inside_url = server_address(server_url(link.server, state_dir))
        except BoxUnavailable as exc:
            fail(str(exc), 2)
        server = (host, port)
        inner += ["--server", inside_url, "--retry-for", str(link.retry_for)]
    if rewards is not None:
        inner += ["--rewards-out", str(rewards)]
    plan = BoxPlan(run_dir=run_dir, study_dir=client.parent,
                   read_only=[*BoxPlan.interpreter_paths(), *(p.resolve() for p in box.box_read)],
                   outputs=[rewards] if rewards else [], hidden=[state_dir], disk_mb=box.box_disk_mb)
    env = {key: os.environ[key] for key in _INHERITED_ENV if key in os.environ}
    env.update(HOME=str(run_dir), TMPDIR=str(run_dir), PYTHONUNBUFFERED="1")
    token = os.environ.get("SWARM_CLIENT_TOKEN") or link.token or _read(state_dir / "client_token")
    if token:
        env["SWARM_CLIENT_TOKEN"] = token

    def report(what: str) -> None:
        err.print(f"sandbox violation: {what}", highlight=False, markup=False, soft_wrap=True)

    from swarm import stopping

    stopping.interrupt_on_sigterm()  # SIGTERM and Ctrl-C are passed on to the boxed `swarm run`
    try:
        code = run_boxed_swarm(inner, plan, env=env, server=server, report=report)
    except BoxUnavailable as exc:
        fail(f"--box needs an OS sandbox and this machine cannot build one: {exc}", 2)
    if code > 128:
        import signal

        try:
            name = signal.Signals(code - 128).name
        except ValueError:
            name = f"signal {code - 128}"
        err.print(f"the boxed client was killed by {name}", highlight=False)
    return code


def _passed_options(flags: Any) -> list[str]:
    """The options of a CLIENT.py run that the box's ``swarm run`` takes as they were given (the data
    options do not apply: ``--box`` runs a CLIENT.py)."""
    argv = ["--seed", str(flags.seed)]
    for option, value in (("--episodes", flags.episodes), ("--concurrency", flags.concurrency),
                          ("--group-size", flags.group_size), ("--eval-every", flags.eval_every),
                          ("--eval-samples", flags.eval_samples)):
        if value is not None:
            argv += [option, str(value)]
    return [*argv, "--probe"] if flags.probe else argv


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None
