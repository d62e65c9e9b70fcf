"""A study's control files on disk, for every reader that needs no graph: the checkpointed state
(read-only), the one-writer lock and the stop request.

``researcher status``, the scheduler and the daemon only read a phase or test a lock; importing
this module loads the SQLite checkpointer, never LangGraph's graph runtime (``researcher.session.runner``
does that when a session actually runs the graph).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, cast

from filelock import FileLock, Timeout
from langgraph.checkpoint.sqlite import SqliteSaver

from researcher.study.layout import StudyLayout
from researcher.study.state import StudyState

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

RECURSION_LIMIT = 100_000  # monitor/launch loops are long; the budget, not the step count, bounds a study


class StudyBusy(RuntimeError):
    """Another process holds the study's lock (one writer per study)."""


class StudyNotFound(LookupError):
    pass


@contextmanager
def study_lock(layout: StudyLayout) -> Iterator[None]:
    layout.artifacts_dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(layout.lock_file), timeout=0)
    owner = layout.artifacts_dir / "study.lock.pid"
    try:
        lock.acquire()
    except Timeout:
        pid = owner.read_text().strip() if owner.is_file() else "?"
        raise StudyBusy(f"study {layout.study_id} is already being run by another researcher process "
                        f"(pid {pid}); wait for it, or `researcher stop {layout.study_id}`") from None
    try:
        try:
            owner.write_text(str(os.getpid()))
        except OSError:  # a full disk: only "which pid" is lost (the lock itself holds no data)
            owner.unlink(missing_ok=True)
        yield
    finally:
        owner.unlink(missing_ok=True)
        lock.release()


def is_locked(layout: StudyLayout) -> bool:
    """Whether a researcher process runs the study now (holds its lock)."""
    if not layout.lock_file.exists():
        return False
    lock = FileLock(str(layout.lock_file), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        return True
    lock.release()
    return False


def config_for(study_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": study_id}, "recursion_limit": RECURSION_LIMIT}


@contextmanager
def checkpointer(layout: StudyLayout) -> Iterator[SqliteSaver]:
    layout.artifacts_dir.mkdir(parents=True, exist_ok=True)
    with SqliteSaver.from_conn_string(str(layout.graph_db)) as saver:
        yield saver


def read_state(layout: StudyLayout) -> StudyState | None:
    """The latest checkpointed state (read-only; works while another process runs the study)."""
    if not layout.graph_db.is_file():
        return None
    with checkpointer(layout) as saver:
        found = saver.get_tuple(config_for(layout.study_id))
    # The checkpoint's channels are the graph's state keys (langgraph types them as plain dict values).
    return None if found is None else cast("StudyState", found.checkpoint["channel_values"])


def request_stop(layout: StudyLayout) -> None:
    layout.artifacts_dir.mkdir(parents=True, exist_ok=True)
    layout.stop_file.write_text(str(time.time()))
