"""The dataset loop behind ``SwarmClient.run``: tasks × GRPO groups through a pool of workers.

Each task becomes ``group_size`` episodes sharing a fresh group id (``"{task_id}:{hex}"``), claimed
in order so a group's members are in flight together and complete together. A workflow's exception
aborts only its own episode (logged and counted); a failed *claim* (server gone past the retry
window, bad token, invalid request) stops the run, because every later claim would fail the same way.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from swarm.client._episode import EpisodeHandle
from swarm.client._errors import SwarmError

if TYPE_CHECKING:
    from swarm.client._client import SwarmClient

log = logging.getLogger(__name__)

Workflow = Callable[[EpisodeHandle, dict[str, Any]], "float | None"]
_RECENT = 50  # the progress bar's reward is the mean of the last this-many finished episodes


@dataclass(frozen=True)
class RunSummary:
    """What a ``run`` did: episodes finished / aborted, their mean reward, and the wall time."""

    finished: int
    aborted: int
    mean_reward: float | None
    seconds: float
    policy_version: int | None = None


class _RunState:
    """Shared by the workers; every field is guarded by ``lock``."""

    def __init__(self, items: Iterator[tuple[dict[str, Any], str]], limit: int | None) -> None:
        self.lock = threading.Lock()
        self.items = items
        self.limit = limit
        self.started = 0
        self.finished = 0
        self.aborted = 0
        self.reward_sum = 0.0
        self.recent: deque[float] = deque(maxlen=_RECENT)
        self.policy_version: int | None = None
        self.stop = False
        self.fatal: BaseException | None = None

    def next_item(self) -> tuple[dict[str, Any], str] | None:
        with self.lock:
            if self.stop or (self.limit is not None and self.started >= self.limit):
                return None
            try:
                item = next(self.items)
            except StopIteration:
                return None
            except Exception as exc:  # a broken task generator ends the run with its error
                self.fail(exc)
                return None
            self.started += 1
            return item

    def fail(self, exc: BaseException) -> None:
        self.stop = True
        if self.fatal is None:
            self.fatal = exc


def _episode_items(tasks: Iterable[dict[str, Any]], group_size: int) -> Iterator[tuple[dict[str, Any], str]]:
    for task in tasks:
        if not isinstance(task, dict) or not isinstance(task.get("task_id"), str) or not task["task_id"]:
            raise ValueError(f"each task must be a dict with a non-empty string 'task_id', got {task!r:.200}")
        group_id = f"{task['task_id']}:{uuid.uuid4().hex[:12]}"
        for _ in range(group_size):
            yield task, group_id


def run_workflow(client: SwarmClient, tasks: Iterable[dict[str, Any]], workflow: Workflow, *, group_size: int,
                 concurrency: int, episodes: int | None, category: str | None, progress: bool) -> RunSummary:
    """Run until tasks run out, ``episodes`` have been started, or a claim fails for good."""
    if group_size < 1 or concurrency < 1:
        raise ValueError(f"group_size and concurrency must be >= 1 (got {group_size}, {concurrency})")
    if episodes is not None and episodes < 1:
        raise ValueError(f"episodes must be >= 1 when given (got {episodes})")
    state = _RunState(_episode_items(tasks, group_size), episodes)
    start = time.monotonic()
    # Import the openai SDK (~1.5 s) while the first claims are in flight, not after them.
    threading.Thread(target=client.openai_pool.client, name="openai-import", daemon=True).start()
    bar = Progress(TextColumn("[bold]swarm run"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("reward(last {task.fields[window]}) {task.fields[reward]}"),
                   TextColumn("aborted {task.fields[aborted]}"), TextColumn("policy v{task.fields[version]}"),
                   TimeElapsedColumn(), disable=not progress)
    with bar:
        bar_task = bar.add_task("episodes", total=episodes, window=_RECENT, reward="-", aborted=0, version="?")

        def refresh() -> None:
            with state.lock:
                reward = f"{sum(state.recent) / len(state.recent):.3f}" if state.recent else "-"
                bar.update(bar_task, completed=state.finished + state.aborted, reward=reward,
                           aborted=state.aborted, version=state.policy_version)

        def worker() -> None:
            while (item := state.next_item()) is not None:
                _one_episode(client, state, workflow, item, group_size, category)
                refresh()

        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="swarm-run") as pool:
            futures = [pool.submit(worker) for _ in range(concurrency)]
            try:
                for future in futures:
                    future.result()
            except KeyboardInterrupt:
                log.warning("interrupted: finishing the episodes in flight, claiming no more")
                with state.lock:
                    state.stop = True
                for future in futures:
                    future.result()
                raise
    if state.fatal is not None:
        raise state.fatal
    mean = state.reward_sum / state.finished if state.finished else None
    return RunSummary(finished=state.finished, aborted=state.aborted, mean_reward=mean,
                      seconds=time.monotonic() - start, policy_version=state.policy_version)


def _one_episode(client: SwarmClient, state: _RunState, workflow: Workflow, item: tuple[dict[str, Any], str],
                 group_size: int, category: str | None) -> None:
    task, group_id = item
    try:
        handle = client.claim(task["task_id"], group_id=group_id, group_size=group_size, category=category)
    except SwarmError as exc:
        log.error("claim failed, stopping the run: %s", exc)
        with state.lock:
            state.fail(exc)
        return
    with state.lock:
        state.policy_version = handle.policy_version
    try:
        with handle:
            reward = workflow(handle, task)
            if not handle.done:
                if reward is None:
                    raise SwarmError("workflow returned no reward and did not call ep.finish")
                handle.finish(float(reward))
            elif handle.state != "finished":
                raise SwarmError(f"episode ended as {handle.state}")
    except Exception as exc:  # a broken episode must never stop the run
        with state.lock:
            state.aborted += 1
            first = state.aborted == 1
        log.warning("episode %s of task %s aborted: %s: %s", handle.episode_id, task["task_id"],
                    type(exc).__name__, exc, exc_info=first)
        return
    reward_value = handle.reward if handle.reward is not None else float("nan")
    with state.lock:
        state.finished += 1
        if math.isfinite(reward_value):
            state.reward_sum += reward_value
            state.recent.append(reward_value)
