"""Running a study client module: what ``swarm run CLIENT.py`` and ``python CLIENT.py`` share.

A study client module defines ``tasks(seed) -> Iterable[dict]`` (each with a ``task_id``) and
``workflow(ep, task) -> float``; optionally ``GROUP_SIZE``, ``CONCURRENCY`` and ``setup(client)``
(for example a supervised warm-up through ``client.sft``), and ``heldout() -> list[dict]``: a fixed
set of held-out tasks, disjoint from every ``tasks(seed)``, that the run evaluates (never trains on)
at step 0 and every ``EVAL_EVERY`` steps (default 5; ``--eval-every`` overrides, 0 turns it off).
Modules load from a file path, so a restarted client picks up edited code; the study imports only
what it needs (the openai SDK is imported the first time an episode asks for a client).

A study may declare ``REWARD_RANGE = (low, high)``, the range its workflow's reward lies in (the
researcher requires it of the clients it writes and checks the rewards of a smoke run against it).
``rewards_out`` (``swarm run --rewards-out FILE``) records every episode's reward as the workflow
produced it, one ``RewardRecord`` JSON line each: the researcher's pre-training checks read it, and a
non-finite reward, which the server refuses (the episode aborts), is recorded all the same.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from pathlib import Path
from types import ModuleType, TracebackType
from typing import SupportsFloat

from pydantic import BaseModel, ConfigDict

from swarm import stopping
from swarm.client._client import SwarmClient
from swarm.client._episode import EpisodeHandle
from swarm.client._errors import SwarmError
from swarm.client._probe import probe_study
from swarm.client._run_state import Task
from swarm.client._runner import RunSummary, Workflow
from swarm.client._study_module import load_study, study_heldout

log = logging.getLogger(__name__)

DEFAULT_STATE_DIR = Path("artifacts/swarm")
DEFAULT_EVAL_EVERY = 5


class RewardRecord(BaseModel):
    """One line of ``--rewards-out``: an episode's task, GRPO group, purpose (``train``/``eval``) and
    reward; ``reward`` is None and ``error`` says why when the workflow raised or returned no number.
    A non-finite reward is written as the JSON string ``"NaN"``/``"Infinity"`` (parsed back to a float)."""

    model_config = ConfigDict(ser_json_inf_nan="strings")

    task_id: str
    group: str
    purpose: str
    reward: float | None
    error: str | None = None


class RewardLog:
    """Writes a ``RewardRecord`` line as each episode's workflow returns (flushed at once, so a run
    killed at its timeout leaves the lines of the episodes that ended); the file holds this run only."""

    def __init__(self, path: Path) -> None:
        try:
            self._file = path.open("w", encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"cannot write the rewards file {path}: {exc.strerror or exc}") from exc
        self._lock = threading.Lock()

    def wrap(self, workflow: Workflow) -> Workflow:
        """``workflow`` unchanged in behaviour (its result and exceptions pass through), recording each episode."""

        def recorded(ep: EpisodeHandle, task: Task) -> float | None:
            try:
                value = workflow(ep, task)
            except Exception as exc:
                self._write(ep, None, f"{type(exc).__name__}: {exc}"[:500])
                raise
            reward, error = _reward_of(ep, value)
            self._write(ep, reward, error)
            return value

        return recorded

    def _write(self, ep: EpisodeHandle, reward: float | None, error: str | None) -> None:
        line = RewardRecord(task_id=ep.task_id, group=ep.group_id, purpose=ep.episode.purpose, reward=reward,
                            error=error).model_dump_json()
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def __enter__(self) -> RewardLog:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _reward_of(ep: EpisodeHandle, value: object) -> tuple[float | None, str | None]:
    """The episode's reward: what ``ep.finish`` posted, else the workflow's return value (as the runner
    will post it), else why there is none."""
    if ep.state == "finished" and ep.reward is not None:
        return ep.reward, None
    if value is None:
        return None, "the workflow returned no reward and did not call ep.finish"
    try:
        if not isinstance(value, SupportsFloat | str):
            raise TypeError(type(value).__name__)
        return float(value), None
    except (TypeError, ValueError):
        return None, f"the workflow returned {value!r:.80} (not a number)"


def run_study(module: ModuleType, client: SwarmClient, *, seed: int = 0, episodes: int | None = None,
              concurrency: int | None = None, group_size: int | None = None, progress: bool = True,
              eval_every: int | None = None, rewards_out: Path | None = None,
              eval_samples: int | None = None) -> RunSummary:
    """``setup(client)`` if the study has one, then ``client.run`` over ``tasks(seed)``, evaluating
    ``heldout()`` every ``eval_every`` steps (default: the study's ``EVAL_EVERY``, else 5; 0: off), each
    task ``eval_samples`` times a round (default: the study's ``EVAL_SAMPLES``, else 1); with
    ``rewards_out``, every episode's reward is recorded there (``RewardLog``)."""
    if rewards_out is None:
        return _run(module, client, module.workflow, seed=seed, episodes=episodes, concurrency=concurrency,
                    group_size=group_size, progress=progress, eval_every=eval_every, eval_samples=eval_samples)
    with RewardLog(rewards_out) as rewards:
        return _run(module, client, rewards.wrap(module.workflow), seed=seed, episodes=episodes,
                    concurrency=concurrency, group_size=group_size, progress=progress, eval_every=eval_every,
                    eval_samples=eval_samples)


def _run(module: ModuleType, client: SwarmClient, workflow: Workflow, *, seed: int, episodes: int | None,
         concurrency: int | None, group_size: int | None, progress: bool, eval_every: int | None,
         eval_samples: int | None) -> RunSummary:
    heldout = study_heldout(module)
    every = int(getattr(module, "EVAL_EVERY", DEFAULT_EVAL_EVERY)) if eval_every is None else eval_every
    if every < 0:
        raise ValueError(f"eval_every must be >= 0 (0: no held-out evaluation), got {every}")
    if every and not heldout and eval_every is not None:
        log.warning("--eval-every %d has no effect: this study defines no heldout() tasks", every)
    setup = getattr(module, "setup", None)
    if callable(setup):
        setup(client)
    return client.run(module.tasks(seed), workflow,
                      group_size=group_size or int(getattr(module, "GROUP_SIZE", 8)),
                      concurrency=concurrency or int(getattr(module, "CONCURRENCY", 16)),
                      episodes=episodes, progress=progress, heldout=heldout, eval_every=every if heldout else 0,
                      eval_samples=eval_samples or int(getattr(module, "EVAL_SAMPLES", 1)))


def stop_on_sigterm() -> None:
    """Make SIGTERM stop a run the way Ctrl-C does: the runner claims nothing more, finishes the
    episodes in flight and aborts the held-out episodes it queued, trying each call once. Without this
    a terminated client leaves its claims to expire with their leases, and a held-out round left live
    holds the server's next training step that long (the next client on that server trains nothing
    meanwhile). A run still stopping after ``stopping.DEADLINE_S`` (a workflow stuck in a call) exits
    then, as does one given a second signal."""
    stopping.interrupt_on_sigterm()


def run_study_cli(file: str, argv: list[str] | None = None) -> None:
    """``if __name__ == "__main__": run_study_cli(__file__)`` makes a study runnable with ``python``."""
    parser = argparse.ArgumentParser(prog=Path(file).name, description="Run this study against a swarm server.")
    parser.add_argument("--server", help="swarm server URL, e.g. http://127.0.0.1:8000 (required unless --probe)")
    parser.add_argument("--episodes", type=int, default=None, help="stop after this many episodes")
    parser.add_argument("--concurrency", type=int, default=None)
    parser.add_argument("--group-size", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=None,
                        help="evaluate the study's heldout() tasks every N steps (default: its EVAL_EVERY, else 5; "
                             "0: off)")
    parser.add_argument("--token", default=None,
                        help="control token (default: $SWARM_TOKEN, then the token file); tools should set "
                             "$SWARM_CLIENT_TOKEN instead, since a command line is visible to every user")
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    parser.add_argument("--rewards-out", type=Path, default=None,
                        help="write one JSON line per episode (task_id, group, purpose, reward) to this file")
    parser.add_argument("--probe", action="store_true",
                        help="check tasks(seed) and heldout() without a server; print one JSON line (exit 1: a "
                             "problem)")
    args = parser.parse_args(argv)
    if args.probe:
        report = probe_study(file)
        print(report.model_dump_json())
        raise SystemExit(0 if report.ok else 1)
    if not args.server:
        parser.error("--server is required (unless --probe)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop_on_sigterm()
    try:
        module = load_study(file)
        with SwarmClient(args.server, token=args.token, token_file=args.state_dir / "token",
                         client_token_file=None if args.token else args.state_dir / "client_token") as client:
            summary = run_study(module, client, seed=args.seed, episodes=args.episodes,
                                concurrency=args.concurrency, group_size=args.group_size, eval_every=args.eval_every,
                                rewards_out=args.rewards_out)
    except (ValueError, SwarmError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2 if isinstance(exc, ValueError) else 1) from None
    except KeyboardInterrupt:
        print("interrupted; the episodes in flight were finished or aborted", file=sys.stderr)
        raise SystemExit(130) from None
    mean = "-" if summary.mean_reward is None else f"{summary.mean_reward:.3f}"
    print(f"finished={summary.finished} aborted={summary.aborted} mean_reward={mean} seconds={summary.seconds:.1f}")
