"""``swarm run``: run a study client (or a data file as one) against a server.

The options are gathered into one ``RunFlags`` of typed groups, each a ``--help`` panel (Study, Server,
Data, Held-out data, Box); the study is loaded (or probed, or built from
``--data``) before the server is contacted, so a bad study fails fast.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar

import typer

from swarm import stopping
from swarm.cli._common import DEFAULT_STATE_DIR, STATE_DIR_HELP, app, connect, fail, grouped, out
from swarm.client import SwarmError, load_study, probe_study, run_study

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StudyFlags:
    """Which study runs, how much of it and how wide, and where its rewards go."""

    PANEL: ClassVar[str] = "Study"
    client_file: Path | None
    episodes: int | None
    concurrency: int | None
    group_size: int | None
    seed: int
    eval_every: int | None
    eval_samples: int | None
    rewards_out: Path | None
    probe: bool


@dataclass(frozen=True)
class ConnectionFlags:
    """Which server, with which token, and how long to wait for it."""

    PANEL: ClassVar[str] = "Server"
    server: str | None
    token: str | None
    state_dir: Path
    retry_for: float


@dataclass(frozen=True)
class DataFlags:
    """A data file, folder or dataset as the study (``--data``): its columns, reward, agent and warm-up."""

    PANEL: ClassVar[str] = "Data"
    data: str | None
    reward: str
    prompt_key: str
    answer_key: str | None
    epochs: int
    workflow: str | None
    warmup_steps: int
    warmup_lr: float


@dataclass(frozen=True)
class HeldOutFlags:
    """The held-out rows of ``--data``: evaluated, never trained."""

    PANEL: ClassVar[str] = "Held-out data"
    heldout: str | None
    heldout_fraction: float | None
    heldout_size: int


@dataclass(frozen=True)
class BoxFlags:
    """The OS sandbox a study client may run in (``--box``)."""

    PANEL: ClassVar[str] = "Box"
    box: bool
    box_read: list[Path]
    box_dir: Path | None
    box_disk_mb: int


@dataclass(frozen=True)
class RunFlags:
    """``swarm run``'s options, one typed group a ``--help`` panel (see its signature for their help)."""

    study: StudyFlags
    connection: ConnectionFlags
    dataset: DataFlags
    held_out: HeldOutFlags
    sandbox: BoxFlags


_STUDY, _SERVER, _DATA, _HELD_OUT, _BOX = (StudyFlags.PANEL, ConnectionFlags.PANEL, DataFlags.PANEL,
                                           HeldOutFlags.PANEL, BoxFlags.PANEL)


@app.command()
def run(
    # Study
    client_file: Annotated[Path | None, typer.Argument(
        metavar="[CLIENT.py]", help="a study client module (or --data FILE instead)", show_default=False)] = None,
    episodes: Annotated[int | None, typer.Option(min=1, help="stop after this many episodes",
                                                 rich_help_panel=_STUDY)] = None,
    concurrency: Annotated[int | None, typer.Option(min=1, help="parallel episodes (default: the study's)",
                                                    rich_help_panel=_STUDY)] = None,
    group_size: Annotated[int | None, typer.Option(min=1, help="episodes per task (default: the study's)",
                                                   rich_help_panel=_STUDY)] = None,
    seed: Annotated[int, typer.Option(help="passed to the study's tasks(seed)", rich_help_panel=_STUDY)] = 0,
    eval_every: Annotated[int | None, typer.Option(
        min=0, help="evaluate the study's heldout() tasks every N steps (default: its EVAL_EVERY, else 5; 0: off)",
        show_default=False, rich_help_panel=_STUDY)] = None,
    eval_samples: Annotated[int | None, typer.Option(
        min=1, help="episodes of each held-out task a round, each with its own sampling noise (default: the "
        "study's EVAL_SAMPLES, else 1); with 2 or more the server reports eval/reward_mean_sd, the round's noise",
        show_default=False, rich_help_panel=_STUDY)] = None,
    rewards_out: Annotated[Path | None, typer.Option(
        help="write one JSON line per episode (task_id, group, purpose, reward) to this file",
        rich_help_panel=_STUDY)] = None,
    probe: Annotated[bool, typer.Option(
        "--probe", help="check tasks(seed) and heldout() without a server (deterministic per seed, seeds differ, "
                        "held-out set disjoint); print one JSON line, exit 1 on a problem",
        rich_help_panel=_STUDY)] = False,
    # Server
    server: Annotated[str | None, typer.Option(help="server URL (default: <state-dir>/server.json)",
                                               rich_help_panel=_SERVER)] = None,
    token: Annotated[str | None, typer.Option(
        envvar="SWARM_TOKEN", show_envvar=True,
        help="token (after $SWARM_CLIENT_TOKEN; else <state-dir>/client_token, else <state-dir>/token)",
        rich_help_panel=_SERVER)] = None,
    state_dir: Annotated[Path, typer.Option(help=STATE_DIR_HELP, rich_help_panel=_SERVER)] = DEFAULT_STATE_DIR,
    retry_for: Annotated[float, typer.Option(help="seconds to keep retrying an unreachable server",
                                             rich_help_panel=_SERVER)] = 120.0,
    # Data
    data: Annotated[str | None, typer.Option(
        metavar="FILE|FOLDER[:SPLIT]|ORG/NAME[:CONFIG][:SPLIT]",
        help="train on data instead of CLIENT.py: a jsonl or parquet file, a datasets save_to_disk folder, or a "
             "Hugging Face dataset name (split default train; offline: from the datasets cache); verl's RL rows "
             "(prompt messages, data_source, reward_model.ground_truth, extra_info), {prompt, answer} rows, or "
             "other columns named by --prompt-key/--answer-key", rich_help_panel=_DATA)] = None,
    reward: Annotated[str, typer.Option(
        help="verl (verl's default_compute_score by data_source), exact, a verl data_source name, or PATH:FUNC "
             "(FUNC(text, row) -> float)", rich_help_panel=_DATA)] = "verl",
    prompt_key: Annotated[str, typer.Option(
        help="the column holding the prompt (text, or a list of {role, content} messages)",
        rich_help_panel=_DATA)] = "prompt",
    answer_key: Annotated[str | None, typer.Option(
        help="the column holding the answer (its ground truth: the text after '####' when present, stripped, "
             "commas removed; the whole, the warm-up's reference); default: reward_model.ground_truth, else answer",
        show_default=False, rich_help_panel=_DATA)] = None,
    epochs: Annotated[int, typer.Option(min=1, help="passes over --data, each shuffled by --seed",
                                        rich_help_panel=_DATA)] = 1,
    workflow: Annotated[str | None, typer.Option(
        help="PATH:FUNC, your agent FUNC(ep, task) -> final text (scored by --reward) or reward",
        rich_help_panel=_DATA)] = None,
    warmup_steps: Annotated[int, typer.Option(
        min=0, help="supervised warm-up on the rows' answers (answer or extra_info.answer) on a fresh server",
        rich_help_panel=_DATA)] = 0,
    warmup_lr: Annotated[float, typer.Option(help="learning rate of the warm-up", rich_help_panel=_DATA)] = 3e-3,
    # Held-out data
    heldout: Annotated[str | None, typer.Option(
        metavar="FILE|FOLDER[:SPLIT]|ORG/NAME[:CONFIG][:SPLIT]",
        help="held-out data, evaluated and never trained (what --data takes: e.g. openai/gsm8k:main:test)",
        rich_help_panel=_HELD_OUT)] = None,
    heldout_fraction: Annotated[float | None, typer.Option(
        help="hold out this fraction of --data by a stable hash of each row", rich_help_panel=_HELD_OUT)] = None,
    heldout_size: Annotated[int, typer.Option(
        min=0, help="evaluate at most this many held-out rows (0: all)", rich_help_panel=_HELD_OUT)] = 64,
    # Box
    box: Annotated[bool, typer.Option(
        "--box", help="run the client in an OS sandbox (bubblewrap namespaces + seccomp): read-only system, "
                      "interpreter and study folder, a private writable run folder, only the server's port, no "
                      "programs or processes; fails if this machine cannot build it", rich_help_panel=_BOX)] = False,
    box_read: Annotated[list[Path], typer.Option(
        help="another path the boxed client may read (a model, a data file); repeatable",
        rich_help_panel=_BOX)] = [],  # noqa: B006 -- typer reads the default, nothing mutates it
    box_dir: Annotated[Path | None, typer.Option(
        help="the boxed client's run folder, its only writable place (default: the current directory); "
             "what it writes there stays in the box, but --rewards-out", show_default=False,
        rich_help_panel=_BOX)] = None,
    box_disk_mb: Annotated[int, typer.Option(
        min=1, help="size of the boxed client's run folder (a tmpfs): writes past it fail", rich_help_panel=_BOX)] = 64,
) -> None:
    """Run a study client (tasks + workflow + reward) against a server until tasks or --episodes run out.

    Claims use the client token: ``$SWARM_CLIENT_TOKEN``, else ``--token``, else
    ``<state-dir>/client_token``, else the control token."""
    flags = grouped(RunFlags, locals())  # every option above, by name (nothing else is defined yet)
    if flags.sandbox.box:  # before the study is imported: its code runs only inside the box
        from swarm.cli._box import run_boxed

        raise typer.Exit(run_boxed(flags))
    module = _study(flags)
    link = flags.connection
    client_token = os.environ.get("SWARM_CLIENT_TOKEN") or link.token
    stopping.interrupt_on_sigterm()  # SIGTERM takes Ctrl-C's path (swarm.client.run_study_cli's too)
    with connect(link.server, link.token, link.state_dir, retry_for_s=link.retry_for,
                 client_token=client_token) as client:
        summary = _run(module, client, flags.study)
    mean = "-" if summary.mean_reward is None else f"{summary.mean_reward:.3f}"
    out.print(f"finished={summary.finished} aborted={summary.aborted} mean_reward={mean} "
              f"seconds={summary.seconds:.1f} policy_version={summary.policy_version}", highlight=False)


def _study(flags: RunFlags) -> Any:
    """The study module (or the data file as a study); ``--probe`` reports on it and exits."""
    client_file, data = flags.study.client_file, flags.dataset.data
    if data is not None and client_file is None:
        study = _data_study(data, flags)
        if flags.study.probe:
            fail("--probe checks a CLIENT.py; --data is checked every time it loads", 2)
        return study
    if client_file is None or data is not None:
        fail("give a study CLIENT.py or --data (one of them)", 2)
    if flags.study.probe:
        report = probe_study(client_file)
        typer.echo(report.model_dump_json())
        raise typer.Exit(0 if report.ok else 1)
    try:
        return load_study(client_file)
    except ValueError as exc:
        fail(str(exc), 2)
    except Exception as exc:  # the study's own import failed: show it plainly, it is the user's code
        log.exception("importing %s failed", client_file)
        fail(f"cannot import {client_file}: {type(exc).__name__}: {exc}", 2)


def _run(module: Any, client: Any, flags: StudyFlags) -> Any:
    """Run the study until its tasks or ``--episodes`` run out; its summary."""
    try:
        return run_study(module, client, seed=flags.seed, episodes=flags.episodes, concurrency=flags.concurrency,
                         group_size=flags.group_size, progress=True, eval_every=flags.eval_every,
                         eval_samples=flags.eval_samples,
                         rewards_out=flags.rewards_out)
    except SwarmError as exc:
        fail(str(exc))
    except ValueError as exc:
        fail(str(exc), 2)
    except KeyboardInterrupt:
        fail("interrupted; the episodes in flight were finished or aborted", 130)


def _data_study(data: str, flags: RunFlags) -> Any:
    """The data file, folder or dataset name as a study (``swarm.data``, imported here only: parquet,
    datasets and verl are heavy); bad data, a dataset that cannot be loaded (with the command that
    fetches it) or a bad reward stops here, before the server is contacted."""
    from swarm.data import DataOptions, build_study

    rows, held, run = flags.dataset, flags.held_out, flags.study
    options = DataOptions(data=data, reward=rows.reward, heldout=held.heldout,
                          heldout_fraction=held.heldout_fraction, heldout_size=held.heldout_size,
                          epochs=rows.epochs, workflow=rows.workflow, warmup_steps=rows.warmup_steps,
                          warmup_lr=rows.warmup_lr, group_size=run.group_size or 8,
                          concurrency=run.concurrency or 16, prompt_key=rows.prompt_key,
                          answer_key=rows.answer_key)
    try:
        study = build_study(options)
    except ValueError as exc:  # DataError is a ValueError: file, row and reason
        fail(str(exc), 2)
    log.info("data %s: %d training rows, %d held-out rows, reward %s", data, len(study.train), len(study.held),
             rows.reward)
    return study
