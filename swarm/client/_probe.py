"""The data probe of a study client: ``swarm run CLIENT.py --probe`` checks its tasks without a server.

A study trains on ``tasks(seed)`` and is judged on ``heldout()``; a mistake in either spoils every
run silently: a generator drawing from the global ``random`` state makes seeds unrepeatable, one
that ignores its seed makes every replication train on the same data, and held-out tasks that also
appear in training measure memory, not skill. The probe imports the module and checks, in one short
process, that

- the first ``tasks_per_seed`` tasks of ``tasks(0)``, drawn twice, are equal (deterministic per seed);
- ``tasks(0)`` and ``tasks(1)`` differ (task ids aside): the seed is used;
- every task is a dict with a non-empty string ``task_id``;
- ``heldout()`` exists, is non-empty, has unique task ids, and none of its tasks (task id aside) is
  among the first ``tasks_per_seed`` tasks of the seeds probed.

Tasks are compared as canonical JSON (sorted keys; a value JSON cannot encode is compared by its
``repr``). The result is a ``ProbeReport``, printed as one JSON line: the researcher runs the probe
boxed (it executes study code) and parses that line. Its limit: a finite prefix of each stream, so an
overlap with the held-out set that only shows after many tasks can pass.
"""

from __future__ import annotations

import itertools
import json
import time
import traceback
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from swarm.client._run_state import check_heldout
from swarm.client._study_module import load_study

PROBE_TASKS = 200  # per seed: enough to meet a held-out task drawn from a pool of a few thousand
PROBE_SEEDS = (0, 1, 2)
_SHOWN = 160  # characters of a task quoted in a message


class ProbeReport(BaseModel):
    """What the probe found: ``problems`` (each a complete sentence for the study's author; empty when
    every check passed), what it looked at, and the traceback of an exception it met, if any."""

    problems: list[str] = Field(default_factory=list)
    seeds: list[int] = Field(default_factory=list)
    tasks_per_seed: int = 0
    heldout: int = 0
    seconds: float = 0.0
    traceback: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems


def probe_study(path: str | Path, *, tasks_per_seed: int = PROBE_TASKS,
                seeds: tuple[int, ...] = PROBE_SEEDS) -> ProbeReport:
    """Import the study client at ``path`` and run the data checks; never raises for the study's faults."""
    start = time.monotonic()
    report = ProbeReport(seeds=list(seeds), tasks_per_seed=tasks_per_seed)
    try:
        module = load_study(path)
    except ValueError as exc:
        report.problems.append(str(exc))
    except Exception as exc:  # the module's own code failed: that is the finding
        report.problems.append(f"importing {Path(path).name} raised {_name(exc)}")
        report.traceback = traceback.format_exc(limit=-4)
    else:
        try:
            _check(module, report, tasks_per_seed, seeds)
        except _StudyRaised as exc:
            report.problems.append(exc.args[0])
            report.traceback = exc.trace
    report.seconds = round(time.monotonic() - start, 3)
    return report


class _StudyRaised(Exception):
    """The study's ``tasks`` or ``heldout`` raised: the message names the call, ``trace`` is its traceback."""

    def __init__(self, message: str, trace: str) -> None:
        super().__init__(message)
        self.trace = trace


def _check(module: Any, report: ProbeReport, count: int, seeds: tuple[int, ...]) -> None:
    first = _draw(module, seeds[0], count)
    if not first:
        report.problems.append(f"tasks({seeds[0]}) yielded no tasks")
        return
    bad = next((task for task in first if not _has_id(task)), None)
    if bad is not None:
        report.problems.append(f"every task must be a dict with a non-empty string 'task_id'; tasks({seeds[0]}) "
                               f"yielded {_show(bad)}")
        return
    again = _draw(module, seeds[0], count)
    differs = next((i for i, (a, b) in enumerate(itertools.zip_longest(first, again)) if _canon(a) != _canon(b)),
                   None)
    if differs is not None:
        report.problems.append(
            f"tasks({seeds[0]}) is not deterministic: called twice, its task {differs} was "
            f"{_show(_at(first, differs))}, then {_show(_at(again, differs))}; draw every random choice from "
            f"random.Random(seed), never from the module-level random functions or the clock")
    streams = {seeds[0]: first}
    for seed in seeds[1:]:
        streams[seed] = _draw(module, seed, count)
        if not all(_has_id(task) for task in streams[seed]):
            report.problems.append(f"every task must be a dict with a non-empty string 'task_id'; tasks({seed}) "
                                   f"yielded {_show(next(t for t in streams[seed] if not _has_id(t)))}")
            return
    if len(seeds) > 1 and [_content(t) for t in first] == [_content(t) for t in streams[seeds[1]]]:
        report.problems.append(
            f"tasks({seeds[0]}) and tasks({seeds[1]}) yield the same first {len(first)} tasks (task ids aside): "
            f"tasks(seed) must use its seed, or every seed of a configuration trains on the same data")
    _check_heldout(module, report, streams)


def _check_heldout(module: Any, report: ProbeReport, streams: dict[int, list[Any]]) -> None:
    heldout_fn = getattr(module, "heldout", None)
    if not callable(heldout_fn):
        report.problems.append("the client defines no heldout(): it must return a fixed, non-empty list of "
                               "held-out tasks that tasks(seed) never yields")
        return
    try:
        held = check_heldout(_call(heldout_fn, "heldout()"))
    except ValueError as exc:
        report.problems.append(f"heldout() is malformed: {exc}")
        return
    report.heldout = len(held)
    if not held:
        report.problems.append("heldout() returned no tasks: the run needs a fixed, non-empty held-out set")
        return
    held_set = {_content(task) for task in held}
    overlaps = [(seed, task) for seed, tasks in streams.items() for task in tasks if _content(task) in held_set]
    if overlaps:
        seed, task = overlaps[0]
        report.problems.append(
            f"heldout() overlaps the training tasks: {len(overlaps)} of {sum(map(len, streams.values()))} tasks "
            f"(the first {report.tasks_per_seed} of seeds {', '.join(map(str, streams))}) are held-out tasks "
            f"(task ids aside), e.g. {_show(task)} "
            f"from tasks({seed}); draw the held-out tasks from their own stream and skip them in tasks(seed)")


def _draw(module: Any, seed: int, count: int) -> list[Any]:
    stream = _call(module.tasks, f"tasks({seed})", seed)
    try:
        return list(itertools.islice(iter(stream), count))
    except Exception as exc:
        raise _StudyRaised(f"iterating tasks({seed}) raised {_name(exc)}", traceback.format_exc(limit=-4)) from exc


def _call(fn: Any, what: str, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:
        raise _StudyRaised(f"{what} raised {_name(exc)}", traceback.format_exc(limit=-4)) from exc


def _has_id(task: Any) -> bool:
    return isinstance(task, dict) and isinstance(task.get("task_id"), str) and bool(task["task_id"])


def _canon(task: Any) -> str:
    return json.dumps(task, sort_keys=True, default=repr)


def _content(task: Any) -> str:
    """A task's canonical JSON without its id: two tasks that differ only by id are the same problem."""
    return _canon({k: v for k, v in task.items() if k != "task_id"} if isinstance(task, dict) else task)


def _at(tasks: list[Any], index: int) -> Any:
    return tasks[index] if index < len(tasks) else "(no task: the stream ended)"


def _show(task: Any) -> str:
    text = task if isinstance(task, str) else _canon(task)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "…"


def _name(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]
