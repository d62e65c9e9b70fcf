"""The dataset loop behind ``SwarmClient.run``: tasks × GRPO groups through a pool of workers.

Each task becomes ``group_size`` episodes sharing a fresh group id (``"{task_id}:{hex}"``), claimed
in order so a group's members are in flight together and complete together: the worker holding a
group's first member claims it, and the workers holding its other members wait for that claim and
then claim at once, so a group the server admits late (``swarm.server.flow.admission`` refuses a new
group until the next step when the backlog is full) still starts all together, never with members
left behind on their own retry timers (those would train versions later, as stale). Groups are claimed
in data order too: a group's first claim waits until the previous group's first claim has ended, so
the server sees the same sequence of groups whatever the concurrency (a ``--deterministic`` server
admits one batch of them per policy version, so each step trains the same groups). A workflow's
exception aborts only its own episode (logged and counted); a failed *claim* (server gone past the
retry window, bad token, invalid request) stops the run, because every later claim would fail the
same way.

Held-out evaluation (``heldout`` tasks, ``eval_every`` > 0): every claim answers with the server's
training step; the first claim to see step 0, and then the first to see each multiple of
``eval_every`` (once the previous round has ended; a multiple missed is skipped, never evaluated
late), claims one eval episode per held-out task at once (``purpose="eval"``: the
server holds its next step until they end, so the round evaluates one policy; the claims carry
``eval_every``, so the server also holds the step after each multiple until its round is claimed,
and rounds fall on exactly 0, k, 2k, … in every run). Workers run queued
eval episodes before claiming more training ones, and while a training claim is refused for now
(admission holds new work until the next step, and that step waits for the round); a refusal that
names the server's step (admission's and sync mode's drain do) starts a round that is due, as a claim
would. A failed eval claim turns evaluation off for the rest of the run (logged), since training need
not stop for it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Protocol

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from swarm import stopping
from swarm.client._episode import EpisodeHandle, OpenAIPool
from swarm.client._errors import SwarmError, SwarmHTTPError
from swarm.client._run_state import RECENT, EvalRound, RunState, Task, check_heldout, episode_items
from swarm.protocol import Purpose

log = logging.getLogger(__name__)

Workflow = Callable[[EpisodeHandle, Task], "float | None"]
_FINISH_GRACE_S = 4.0  # after an interrupt, episodes in flight get this long to finish, then are aborted


class EpisodeSource(Protocol):
    """What the loop needs of its ``SwarmClient``: claims, the shared OpenAI clients, and a way to
    give up retrying when the run is interrupted."""

    @property
    def openai_pool(self) -> OpenAIPool: ...

    def stop_retrying(self) -> None: ...

    def claim(self, task_id: str, *, group_id: str | None = None, group_size: int | None = None,
              category: str | None = None, purpose: Purpose = "train", eval_every: int | None = None,
              while_refused: Callable[[SwarmHTTPError], None] | None = None) -> EpisodeHandle: ...


@dataclass(frozen=True)
class RunSummary:
    """What a ``run`` did: episodes finished / aborted, their mean reward, and the wall time (training
    episodes only); ``eval_rounds`` held-out rounds claimed, ``eval_finished`` eval episodes finished."""

    finished: int
    aborted: int
    mean_reward: float | None
    seconds: float
    policy_version: int | None = None
    eval_rounds: int = 0
    eval_finished: int = 0


def run_workflow(client: EpisodeSource, tasks: Iterable[Task], workflow: Workflow, *, group_size: int,
                 concurrency: int, episodes: int | None, category: str | None, progress: bool,
                 heldout: Iterable[Task] | None = None, eval_every: int = 0, eval_samples: int = 1) -> RunSummary:
    """Run until tasks run out, ``episodes`` have been started, or a claim fails for good; evaluate
    ``heldout`` at step 0 and every ``eval_every`` steps (0: never), each task ``eval_samples`` times a round."""
    if group_size < 1 or concurrency < 1:
        raise ValueError(f"group_size and concurrency must be >= 1 (got {group_size}, {concurrency})")
    if episodes is not None and episodes < 1:
        raise ValueError(f"episodes must be >= 1 when given (got {episodes})")
    if eval_every < 0:
        raise ValueError(f"eval_every must be >= 0 (0: no held-out evaluation), got {eval_every}")
    if eval_samples < 1:
        raise ValueError(f"eval_samples must be >= 1 (each held-out task's episodes a round), got {eval_samples}")
    heldout = [task for task in check_heldout(heldout or []) for _ in range(eval_samples)]
    state = RunState(episode_items(tasks, group_size), episodes, heldout, eval_every)
    start = time.monotonic()
    # Import the openai SDK (~1.5 s) while the first claims are in flight, not after them.
    threading.Thread(target=client.openai_pool.client, name="openai-import", daemon=True).start()
    bar = Progress(TextColumn("[bold]swarm run"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("reward(last {task.fields[window]}) {task.fields[reward]}"),
                   TextColumn("aborted {task.fields[aborted]}"), TextColumn("policy v{task.fields[version]}"),
                   TimeElapsedColumn(), disable=not progress)
    with bar:
        bar_task = bar.add_task("episodes", total=episodes, window=RECENT, reward="-", aborted=0, version="?")

        def refresh() -> None:
            with state.lock:
                reward = f"{sum(state.recent) / len(state.recent):.3f}" if state.recent else "-"
                bar.update(bar_task, completed=state.finished + state.aborted, reward=reward,
                           aborted=state.aborted, version=state.policy_version)

        def worker() -> None:
            while True:
                if (job := state.next_eval_job()) is not None:  # a claimed eval episode runs first
                    _one_eval(state, workflow, *job)
                elif (item := state.next_item()) is not None:
                    _one_episode(client, state, workflow, item, group_size, category)
                else:
                    return
                refresh()

        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="swarm-run") as pool:
            futures = [pool.submit(worker) for _ in range(concurrency)]
            try:
                stopping.wait_interruptibly(futures)  # untimed, a stop signal another thread caught would wait
            except KeyboardInterrupt:
                _interrupted(client, state, futures)
                raise
            finally:
                _abort_queued_evals(state)
    if state.fatal is not None:
        raise state.fatal
    mean = state.reward_sum / state.finished if state.finished else None
    return RunSummary(finished=state.finished, aborted=state.aborted, mean_reward=mean,
                      seconds=time.monotonic() - start, policy_version=state.policy_version,
                      eval_rounds=state.eval_rounds, eval_finished=state.eval_finished)


def _interrupted(client: EpisodeSource, state: RunState, futures: list[Future[None]]) -> None:
    """Ctrl-C or SIGTERM: claim nothing more and retry nothing, release the queued held-out episodes
    now, give the episodes in flight ``_FINISH_GRACE_S`` to finish, abort those still playing (their
    workflow's next call fails), and wait for the workers."""
    log.warning("interrupted: finishing the episodes in flight, claiming no more")
    with state.lock:
        state.stop = True
    client.stop_retrying()  # a dead or refusing server: give up its calls now, not in minutes
    _abort_queued_evals(state)
    if wait(futures, timeout=_FINISH_GRACE_S).not_done:
        with state.lock:
            playing = list(state.playing)
        log.warning("aborting the %d episodes still in flight after %.0f s", len(playing), _FINISH_GRACE_S)
        for handle in playing:
            handle.abort("the run was interrupted")
    stopping.wait_interruptibly(futures)


def _play(state: RunState, handle: EpisodeHandle, workflow: Workflow, task: Task) -> None:
    """Run the workflow on a claimed episode and make sure it ends finished (or raise)."""
    with state.lock:
        state.playing.add(handle)
    try:
        with handle:
            reward = workflow(handle, task)
            if not handle.done:
                if reward is None:
                    raise SwarmError("workflow returned no reward and did not call ep.finish")
                handle.finish(float(reward))
            elif handle.state != "finished":
                raise SwarmError(f"episode ended as {handle.state}")
    finally:
        with state.lock:
            state.playing.discard(handle)


def _one_episode(client: EpisodeSource, state: RunState, workflow: Workflow, item: tuple[Task, str],
                 group_size: int, category: str | None) -> None:
    task, group_id = item

    def play_queued_eval() -> None:  # while the claim waits: the server's next step may wait for this round
        if (job := state.next_eval_job()) is not None:
            _one_eval(state, workflow, *job)

    def refused(answer: SwarmHTTPError) -> None:
        step = answer.detail.get("step") if isinstance(answer.detail, dict) else None
        if isinstance(step, int) and state.eval_due(step):  # admission names the step: its round may be due
            _claim_eval_round(client, state, step)
        play_queued_eval()

    opened, first, before = state.group_turn(group_id, group_size)
    gate = before if first else opened  # a group's first claim waits for the previous group's
    while gate is not None and not gate.wait(timeout=0.1):
        if state.stop:  # a stopped run claims nothing more (the worker it waits for may never claim)
            opened.set()
            return
        play_queued_eval()
    try:
        handle = client.claim(task["task_id"], group_id=group_id, group_size=group_size, category=category,
                              while_refused=refused)
    except SwarmError as exc:
        with state.lock:
            if state.stop:  # interrupted: its retries were given up on purpose
                return
            state.fail(exc)
        log.error("claim failed, stopping the run: %s", exc)
        return
    finally:
        opened.set()  # the group's other members claim now
    with state.lock:
        state.policy_version = handle.policy_version
    if state.eval_due(handle.episode.step):
        _claim_eval_round(client, state, handle.episode.step)
    try:
        _play(state, handle, workflow, task)
    except Exception as exc:  # a broken episode must never stop the run
        with state.lock:
            state.aborted += 1
            first = state.aborted == 1
        log.warning("episode %s of task %s aborted: %s: %s", handle.episode_id, task["task_id"],
                    type(exc).__name__, exc, exc_info=first)
        return
    reward_value = handle.reward if handle.reward is not None else float("nan")
    # The client's own record of what the server acknowledged (one line per training episode): what a
    # soak or an audit checks the server's store against (tests/soak).
    log.info("finished episode %s (task %s, reward %s)", handle.episode_id, task["task_id"], reward_value)
    with state.lock:
        state.finished += 1
        if math.isfinite(reward_value):
            state.reward_sum += reward_value
            state.recent.append(reward_value)


def _claim_eval_round(client: EpisodeSource, state: RunState, step: int) -> None:
    """Claim one eval episode per held-out task (each task ``eval_samples`` times: the server gives each of
    its samples its own noise), all before any runs (so the server's step cannot move mid-round), and queue
    them for the workers."""
    claimed: list[EpisodeHandle] = []
    try:
        for task in state.heldout:
            claimed.append(client.claim(task["task_id"], purpose="eval", eval_every=state.eval_every))
    except SwarmError as exc:
        log.error("claiming a held-out eval episode failed; evaluation is off for the rest of this run: %s", exc)
        with state.lock:
            state.next_eval = None
            state.eval_busy = False
        for handle in claimed:
            with handle:  # leaving without a reward aborts it
                pass
        return
    if not claimed:
        with state.lock:
            state.eval_busy = False
        return
    round_ = EvalRound(claimed[0].episode.step, len(claimed))
    log.info("held-out evaluation of step %d: %d episodes", round_.step, len(claimed))
    with state.lock:
        state.eval_rounds += 1
        state.evals.extend((handle, task, round_) for handle, task in zip(claimed, state.heldout, strict=True))


def _one_eval(state: RunState, workflow: Workflow, handle: EpisodeHandle, task: Task,
              round_: EvalRound) -> None:
    try:
        _play(state, handle, workflow, task)
    except Exception as exc:  # a failed eval episode leaves no reward; the round goes on
        log.warning("eval episode %s of held-out task %s aborted: %s: %s", handle.episode_id, task["task_id"],
                    type(exc).__name__, exc)
    with state.lock:
        round_.pending -= 1
        if handle.reward is not None and handle.state == "finished":
            state.eval_finished += 1
            round_.rewards.append(handle.reward)
        done = round_.pending == 0
        if done:
            state.eval_busy = False
    if done and round_.rewards:
        log.info("held-out evaluation of step %d: mean reward %.3f over %d episodes", round_.step,
                 sum(round_.rewards) / len(round_.rewards), len(round_.rewards))


def _abort_queued_evals(state: RunState) -> None:
    """A stopped run ends the eval episodes it claimed but never ran (nothing is left claimed)."""
    with state.lock:
        queued, state.evals = list(state.evals), deque()
    for handle, _, _ in queued:
        handle.abort("the run stopped before this eval episode ran")
        handle.close()
