"""``swarm status|metrics|plan|events``: watch a server (rich tables for people, ``--json`` for tools)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from swarm.cli._common import DEFAULT_STATE_DIR, AsJson, StateDir, Token, Url, app, connect, err, fail, out, print_json
from swarm.client import SwarmClient, SwarmError
from swarm.protocol import DiskStatus, Status, StepMetrics, WorkerStatus


@app.command()
def status(url: Url = None, json_: AsJson = False, token: Token = None, state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """The server's state, policy version, step, episode counts and throughput."""
    with connect(url, token, state_dir) as client:
        try:
            result = client.status()
        except SwarmError as exc:
            fail(str(exc))
        fix = _drop_fix(client, result) if not json_ else None
    if json_:
        print_json(result)
        return
    table = Table(title=f"swarm server {client.url}", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("state", result.state.value)
    if result.disk is not None:
        table.add_row("disk", _describe_disk(result.disk))
    table.add_row("model", result.model)
    if "device" in result.generator:  # the in-process torch engine: where it runs and in what dtype
        table.add_row("device", f"{result.generator['device']} ({result.generator.get('dtype', 'float32')})")
    table.add_row("policy version", str(result.policy_version))
    table.add_row("step", str(result.step))
    table.add_row("episodes", "  ".join(f"{k}={v}" for k, v in result.episodes.model_dump().items()))
    table.add_row("groups pending", str(result.groups_pending))
    table.add_row("clients", str(result.clients))
    table.add_row("config version", str(result.config_version))
    table.add_row("defaults", _describe_defaults(result))
    for key, value in sorted(result.throughput.items()):
        table.add_row(key, f"{value:.4g}")
    table.add_row("uptime", f"{result.uptime_s:.0f} s")
    for worker in result.workers:  # the generator pool, the server's own generator ("local") first
        table.add_row(f"worker {worker.id}", _describe_worker(worker))
    recent = result.recent
    table.add_row(f"last {recent.window_s:.0f} s", f"finished={recent.finished}  dropped={recent.dropped}  "
                  f"dropped_stale={recent.dropped_stale}  refused_stale={recent.refused_stale}")
    for label, reasons in (("dropped for", result.drop_reasons), ("refused for", result.refusal_reasons)):
        if reasons:
            table.add_row(label, "  ".join(f"{reason}: {n}" for reason, n in sorted(reasons.items())))
    out.print(table)
    if fix is not None:
        out.print(f"[bold yellow]fix:[/bold yellow] {fix}")


def _drop_fix(client: SwarmClient, status: Status) -> str | None:
    """The fix line for a high drop rate (``swarm.plan.drop_fix``), from the server's live config."""
    from swarm.plan import drop_fix

    if not status.recent.dropped:
        return None
    try:
        values = client.config().values
    except SwarmError:  # a client token may not read the config: the advice then assumes its defaults
        values = {}
    return drop_fix(status, values)


def _describe_defaults(status: Status) -> str:
    """Which defaults the config started from, and the values taken, on one line."""
    defaults = status.defaults
    line = "built-in (ServerConfig's, sized for the tiny presets)"
    if defaults.source == "model-scaled":
        taken = "  ".join(f"{key}={value}" for key, value in sorted(defaults.keys.items()))
        line = f"model-scaled for {status.model}: {taken or 'none taken (the config sets every one)'}"
    return line + ("  (resumed: the state dir's stored config stands)" if defaults.resumed else "")


def _describe_disk(disk: DiskStatus) -> str:
    """Free space under the state dir; "disk full" (and why) when claims are refused for it."""
    free = f"{_mib(disk.free_bytes)} free (reserve {_mib(disk.reserve_bytes)})"
    if not disk.full:
        return free
    return f"[bold red]disk full[/bold red]: {free}; new claims answer 507: {escape(disk.reason)}"


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _describe_worker(worker: WorkerStatus) -> str:
    """One pool member on one line: what serves, which version it holds, how busy and how fast it is."""
    version = "-" if worker.version is None else str(worker.version)
    parts = [worker.state, worker.engine, f"v{version}", f"{worker.in_flight}/{worker.capacity} in flight",
             f"{worker.tokens_per_s:.0f} tok/s"]
    if worker.logprob_diff_max is not None:
        parts.append(f"logprob diff max {worker.logprob_diff_max:.3g}")
    if worker.address:
        parts.append(worker.address)
    return "  ".join(parts)


@app.command()
def metrics(url: Url = None, since: Annotated[int, typer.Option(help="first step to show")] = 0,
            keys: Annotated[str | None, typer.Option(help="comma-separated metric keys to show")] = None,
            json_: AsJson = False, token: Token = None, state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Per-step training metrics (slash-named keys such as train/reward_mean)."""
    with connect(url, token, state_dir) as client:
        try:
            steps = client.metrics(since_step=since)
        except SwarmError as exc:
            fail(str(exc))
    if json_:
        print_json(steps)
        return
    available = sorted({k for s in steps for k in s.metrics})
    shown = [k.strip() for k in keys.split(",") if k.strip()] if keys else _default_keys(steps, available)
    table = Table(title=f"metrics since step {since}")
    for column in ("step", "version", *shown):
        table.add_column(column, justify="right", overflow="fold")  # long slash keys wrap, not truncate
    for s in steps:
        cells = [f"{s.metrics[k]:.4g}" if k in s.metrics else "-" for k in shown]
        table.add_row(str(s.step), str(s.policy_version), *cells)
    out.print(table)
    if not keys and len(available) > len(shown):
        err.print(f"{len(available) - len(shown)} more keys; pick with --keys (available: {', '.join(available)})")


def _default_keys(steps: list[StepMetrics], available: list[str]) -> list[str]:
    """What a study judges on first (held-out reward, when evaluated), then train reward and loss, then
    other keys up to six, leaving out any whose every value is zero (``context/*`` on a run that never
    forked)."""
    first = [k for k in ("eval/reward_mean", "train/reward_mean", "train/loss") if k in available]
    moving = [k for k in available if k not in first and any(s.metrics.get(k, 0.0) != 0.0 for s in steps)]
    return first + moving[: max(0, 6 - len(first))]


@app.command()
def plan(url: Url = None,
         staleness: Annotated[int | None, typer.Option(help="plan for this max_staleness (default: the server's)")] = None,
         target_busy: Annotated[float, typer.Option(help="learner utilisation to reach, in (0, 1)")] = 0.9,
         json_: AsJson = False, token: Token = None, state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """How many clients, at what concurrency, keep the learner busy (ECHO-2's provisioning rule on
    the server's live figures: perf/learner_busy, perf/rollout_eps_per_client, step and sync times)."""
    from swarm.plan import NotEnoughData, WorkerFigure, advise, advise_pool, describe, describe_pool, measure

    with connect(url, token, state_dir) as client:
        try:
            status, config, steps = client.status(), client.config().values, client.metrics()
        except SwarmError as exc:
            fail(str(exc))
    try:
        figures = measure(steps, clients=status.clients, in_flight=int(status.throughput.get("in_flight", 0)))
        advice = advise(figures, mode=config["mode"], target_busy=target_busy,
                        staleness=config["max_staleness"] if staleness is None else staleness)
    except (NotEnoughData, ValueError) as exc:
        fail(str(exc), code=2)
    remote = [WorkerFigure(id=w.id, engine=w.engine, state=w.state, tokens_per_s=w.tokens_per_s)
              for w in status.workers if w.id != "local"]  # the pool's workers (the server's own stays)
    pool = advise_pool(advice, remote) if remote else None
    if json_:
        print(json.dumps({**advice.as_dict(), **({"pool": pool.as_dict()} if pool else {})}, indent=2))
        return
    for line in describe(advice) + (describe_pool(pool, figures.disseminate_s) if pool else []):
        out.print(line)


@app.command()
def events(url: Url = None,
           last_event_id: Annotated[int | None, typer.Option(help="resume after this event id")] = None,
           json_: AsJson = False, token: Token = None, state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Print the server's live event stream (episode.*, step.*, weights.*, config.*) until Ctrl-C."""
    with connect(url, token, state_dir, retry_for_s=30.0) as client:
        try:
            for event in client.events(last_event_id=last_event_id):
                if json_:
                    print(event.model_dump_json(), flush=True)
                else:
                    out.print(f"[dim]{event.id:>6}[/dim] [bold]{event.type:<18}[/bold] "
                              f"{json.dumps(event.data, separators=(',', ':'))}", highlight=False)
        except KeyboardInterrupt:
            return
        except SwarmError as exc:
            fail(str(exc))
