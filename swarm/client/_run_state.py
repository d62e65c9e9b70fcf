"""What ``SwarmClient.run``'s workers share (``RunState``: the task stream, the counts, GRPO group
turns and the held-out rounds, all under one lock), and the checks of the tasks it is given.
``swarm.client._runner`` (the loop) explains the rules these implement."""

from __future__ import annotations

import threading
import uuid
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from swarm.client._episode import EpisodeHandle

# A task as a study defines it: the study's own data (a prompt, an answer, a tool set, ...), given to its
# workflow as it is; the runner reads only an optional ``task_id``. Its values are the study's business,
# so they stay untyped here: a typed Mapping would refuse workflows annotated ``task: dict``.
Task = dict[str, Any]
RECENT = 50  # the progress bar's reward is the mean of the last this-many finished episodes


class EvalRound:
    """One held-out round as this client sees it (the server's tally is what metrics report)."""

    def __init__(self, step: int, size: int) -> None:
        self.step = step
        self.pending = size
        self.rewards: list[float] = []


class RunState:
    """Shared by the workers; every field is guarded by ``lock``."""

    def __init__(self, items: Iterator[tuple[Task, str]], limit: int | None,
                 heldout: list[Task], eval_every: int) -> None:
        self.lock = threading.Lock()
        self.items = items
        self.limit = limit
        self.started = 0
        self.finished = 0
        self.aborted = 0
        self.reward_sum = 0.0
        self.recent: deque[float] = deque(maxlen=RECENT)
        self.policy_version: int | None = None
        self.stop = False
        self.fatal: BaseException | None = None
        self.heldout = heldout
        self.eval_every = eval_every
        self.next_eval: int | None = 0 if heldout and eval_every > 0 else None  # the step a round is due at
        self.evals: deque[tuple[EpisodeHandle, Task, EvalRound]] = deque()  # claimed, not yet run
        self.eval_rounds = 0
        self.eval_finished = 0
        self.eval_busy = False  # a round is being claimed or run: the next one waits for it
        self.playing: set[EpisodeHandle] = set()  # episodes whose workflow runs now
        self.groups: dict[str, tuple[threading.Event, int]] = {}  # group id -> (its first claim ended, members left)
        # group id -> (its first claim ended, the previous group's): set when its first item is handed out
        self.claim_order: dict[str, tuple[threading.Event, threading.Event | None]] = {}
        self.last_opened: threading.Event | None = None

    def group_turn(self, group_id: str, size: int) -> tuple[threading.Event, bool, threading.Event | None]:
        """The event set once the group's first claim has ended, whether this member makes it, and the
        previous group's event (its first claim waits for that one: groups are claimed in data order)."""
        with self.lock:
            opened, before = self.claim_order.get(group_id, (threading.Event(), None))
            opened, left = self.groups.get(group_id, (opened, size))
            first = left == size
            if left > 1:
                self.groups[group_id] = (opened, left - 1)
            else:
                self.groups.pop(group_id, None)
                self.claim_order.pop(group_id, None)
            return opened, first, before

    def eval_due(self, step: int) -> bool:
        """Whether a claim that saw ``step`` should start a held-out round (it then owns that round).
        Rounds fall on multiples of ``eval_every`` only: a client started mid-run (a top-up) or one
        that missed a multiple waits for the next, so every run of a study evaluates at the same steps."""
        with self.lock:
            if self.stop or self.eval_busy or self.next_eval is None or step < self.next_eval:
                return False
            self.next_eval = (step // self.eval_every + 1) * self.eval_every
            if step % self.eval_every:
                return False
            self.eval_busy = True
            return True

    def next_eval_job(self) -> tuple[EpisodeHandle, Task, EvalRound] | None:
        with self.lock:
            return self.evals.popleft() if self.evals and not self.stop else None

    def next_item(self) -> tuple[Task, str] | None:
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
            group_id = item[1]
            if group_id not in self.claim_order:  # handed out in data order, so chained in data order
                self.claim_order[group_id] = (threading.Event(), self.last_opened)
                self.last_opened = self.claim_order[group_id][0]
            return item

    def fail(self, exc: BaseException) -> None:
        self.stop = True
        if self.fatal is None:
            self.fatal = exc


def episode_items(tasks: Iterable[Task], group_size: int) -> Iterator[tuple[Task, str]]:
    for task in tasks:
        if not isinstance(task, dict) or not isinstance(task.get("task_id"), str) or not task["task_id"]:
            raise ValueError(f"each task must be a dict with a non-empty string 'task_id', got {task!r:.200}")
        group_id = f"{task['task_id']}:{uuid.uuid4().hex[:12]}"
        for _ in range(group_size):
            yield task, group_id


def check_heldout(heldout: Iterable[Task]) -> list[Task]:
    """The held-out tasks as a list; ``ValueError`` unless each is a dict with its own ``task_id``."""
    tasks = list(heldout)
    seen: set[str] = set()
    for task in tasks:
        if not isinstance(task, dict) or not isinstance(task.get("task_id"), str) or not task["task_id"]:
            raise ValueError(f"each held-out task must be a dict with a non-empty string 'task_id', got {task!r:.200}")
        if task["task_id"] in seen:
            raise ValueError(f"held-out task_id {task['task_id']!r} appears twice")
        seen.add(task["task_id"])
    return tasks
