"""A study's event log: ``artifacts/<study>/events.jsonl``, append-only, one JSON object a line.

Every line is ``{"id": N, "ts": UNIX_SECONDS, "kind": "...", ...fields}``. Ids start at 1 and
increase by one per event for the whole life of the study, across researcher restarts: a writer
takes the file lock (``events.jsonl.lock``), reads the last id from the end of the file and appends
its line whole (``files.append_whole``: a write a full disk cuts short is truncated back, and the
event is not written). Two processes never interleave a line, and a reader that sees a line whole
sees every line before it.

A researcher killed mid-write (SIGKILL) can leave a last line without its newline. Readers only take
lines that end in a newline, so they never see it; the next writer ends it with a newline first, after
which readers skip it as unparseable, and its id goes to the next event: no reader sees a gap or a
repeat. What writes the events: every ``StudyContext.say`` of a session (``recorder``), plus the
graph's node entries and exits and the LLM planner's calls (``llm_call_listener``). Who reads them:
``researcher watch`` (``researcher.operations.watch``) and the daemon's SSE endpoint (``researcher.operations.events_http``).

Event kinds (fields besides id, ts, kind):
- ``session``: a researcher process took the study (action start | resume, pid).
- ``node``: action enter | leave | fail, node, doing (what the node does, in words; on enter), phase,
  error (on fail: the exception; the graph's retry policy may enter the node again).
- ``framed``: question, task, knob. ``planned``: iteration, experiments, seeds, rationale.
  ``decided``: action (continue | conclude), reason. ``llm_call``: step, model, seconds, tokens,
  error, summary (the start of the answer) — the planner's decisions and their reasons. ``takeover``:
  step, by (offline), reason — the offline planner answered a step the LLM planner failed (the report lists them).
- ``client`` (iteration, repaired: a repair round when true), ``validated`` (attempt, ok, error).
  ``sandbox_violation`` (key, iteration, attempt, what): a denial the OS sandbox reported for study code
  (``swarm run --box``'s ``sandbox violation:`` lines in the smoke run).
- ``launched``: key, experiment, seed, url. ``progress``: key, experiment, seed, step, target, reward
  (the study's metric, when that step logged it) and train_reward. ``client_restart``: key, step.
  ``ended``: key, status, step, reason. ``unparked``: key, step.
- ``watchdog``: name (client_stuck | park), key or reason. ``parked``: reason, phase, runs.
  ``disk_full``: node, error — a node's write failed for want of space; the study parks.
- ``analyzed``: iteration, best, lines. ``report``: path, answer, phase.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from filelock import FileLock

from researcher.runs.logs import rotate
from researcher.study.files import append_whole
from researcher.study.layout import StudyLayout
from researcher.types.usage import LLMCall

log = logging.getLogger(__name__)
__all__ = ["NODE_DOING", "Event", "EventLog", "Follower", "events_path", "llm_call_listener", "read_events", "recorder"]

EVENTS_FILE = "events.jsonl"
EVENTS_MAX_BYTES = 32 * 2**20  # beyond this the log rotates to events.jsonl.1 (ids go on from there)
EVENTS_KEEP = 3  # rotated files kept: events.jsonl.1 (newest) .. events.jsonl.3
_TAIL = 65536  # bytes read from the end to find the last id (far more than one event)
# What each graph node is doing while it runs, for a person watching.
NODE_DOING = {
    "frame_topic": "framing the topic: which task, knob and metric answer the question",
    "plan_experiments": "planning the iteration: hypotheses, experiments and seeds",
    "write_client": "writing the experiments' client code",
    "validate": "validating the client: checks and a smoke run on a real server",
    "launch_runs": "launching training runs",
    "monitor": "polling live runs (steps, rewards, watchdogs)",
    "analyze": "analysing the iteration's runs",
    "decide": "deciding: another iteration or conclude",
    "park": "parking the study until its next session",
    "write_report": "writing the report",
}
# New kinds the terminal printer of `researcher start` leaves to `researcher watch`.
NOT_PRINTED = frozenset({"node", "llm_call", "session"})
# One event as its line holds it: id, ts, kind and the kind's own fields (the list above). Readers
# look a field up under the kind that writes it, so its type is the kind's, not this alias's.
Event = dict[str, Any]


def events_path(layout: StudyLayout) -> Path:
    return layout.artifacts_dir / EVENTS_FILE


class EventLog:
    """The writer: ``append`` adds one event under the file lock and returns it (with its id). A log
    past ``max_bytes`` is rotated first (``events.jsonl.1`` .. ``.<keep>``), so a study of days keeps a
    bounded log; ids continue from the rotated file."""

    def __init__(self, path: Path, max_bytes: int = EVENTS_MAX_BYTES, keep: int = EVENTS_KEEP) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        self._lock = FileLock(str(path) + ".lock")

    def append(self, kind: str, **fields: Any) -> Event:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            last_id, needs_newline = _last_id(self.path)
            if _size(self.path) >= self.max_bytes:
                rotate(self.path, self.keep)
                needs_newline = False
            event = {"id": last_id + 1, "ts": round(time.time(), 3), "kind": kind, **fields}
            line = json.dumps(event, default=str, ensure_ascii=False) + "\n"
            append_whole(self.path, ("\n" if needs_newline else "") + line)  # whole, or nothing (a full disk)
        return event


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _last_id(path: Path) -> tuple[int, bool]:
    """The id of the file's last whole event (of the rotated ``.1`` when the file is new), and
    whether the file ends in a torn line."""
    rotated = path.with_name(path.name + ".1")
    if _size(path) == 0 and rotated.exists():
        return _last_id_in(rotated)[0], False
    return _last_id_in(path)


def _last_id_in(path: Path) -> tuple[int, bool]:
    try:
        with open(path, "rb") as file:
            file.seek(0, os.SEEK_END)
            size = file.tell()
            if size == 0:
                return 0, False
            start = max(size - _TAIL, 0)
            while True:
                file.seek(start)
                chunk = file.read()
                torn = not chunk.endswith(b"\n")
                for raw in reversed(chunk.splitlines()):
                    event = _parse(raw)
                    if event is not None:
                        return int(event["id"]), torn
                if start == 0:
                    return 0, torn
                start = max(start - 16 * _TAIL, 0)  # a long run of unparseable lines: look further back
    except FileNotFoundError:
        return 0, False


def _parse(raw: bytes) -> Event | None:
    try:
        event = json.loads(raw)
    except ValueError:
        return None
    return event if isinstance(event, dict) and isinstance(event.get("id"), int) else None


class Follower:
    """A reader that keeps its place: each ``poll`` returns the whole events appended since the last
    one (only lines ending in a newline; a line being written waits for the next poll)."""

    def __init__(self, path: Path, after_id: int = 0) -> None:
        self.path = path
        self.after_id = after_id
        self._offset = 0

    def poll(self) -> list[Event]:
        try:
            with open(self.path, "rb") as file:
                file.seek(0, os.SEEK_END)
                if file.tell() < self._offset:  # rotated: finish the old file (now .1), then read this one
                    skipped, self._offset = self._rest_of_rotated(), 0
                else:
                    skipped = b""
                file.seek(self._offset)
                chunk = skipped + file.read()
        except FileNotFoundError:
            return []
        whole = chunk[:chunk.rfind(b"\n") + 1]
        self._offset += len(whole) - len(skipped)  # an offset into the current file
        found = []
        for raw in whole.splitlines():
            event = _parse(raw)
            if event is not None and event["id"] > self.after_id:
                found.append(event)
                self.after_id = event["id"]
        return found

    def _rest_of_rotated(self) -> bytes:
        """What the rotated file holds past this reader's offset (whole lines only)."""
        try:
            with open(self.path.with_name(self.path.name + ".1"), "rb") as file:
                file.seek(self._offset)
                rest = file.read()
        except FileNotFoundError:
            return b""
        return rest[:rest.rfind(b"\n") + 1]

    def follow(self, interval_s: float = 0.25, stop: Callable[[], bool] = lambda: False) -> Iterator[Event]:
        while not stop():
            yield from self.poll()
            time.sleep(interval_s)


def read_events(path: Path, after_id: int = 0) -> list[Event]:
    """Every whole event with an id above ``after_id``."""
    return Follower(path, after_id).poll()


def recorder(layout: StudyLayout, then: Callable[[str, Mapping[str, object]], None] | None = None, *,
             max_bytes: int = EVENTS_MAX_BYTES, keep: int = EVENTS_KEEP) -> Callable[[str, Mapping[str, object]], None]:
    """A ``StudyContext.emit`` that appends each event to the study's log, then hands it to ``then``
    (the terminal printer) unless it is one of the kinds only ``researcher watch`` shows. Writing is
    best effort: a full disk must not stop the study (the disk watchdog parks it)."""
    events = EventLog(events_path(layout), max_bytes=max_bytes, keep=keep)

    def emit(kind: str, data: Mapping[str, object]) -> None:
        try:
            events.append(kind, **data)
        except OSError as exc:
            # Its content too: on a full disk this line (stderr) is the only record of the event.
            log.warning("could not append the %s event %s to %s: %s", kind, json.dumps(data, default=str)[:500],
                        events.path, exc)
        if then is not None and kind not in NOT_PRINTED:
            then(kind, data)

    return emit


def llm_call_listener(say: Callable[..., None]) -> Callable[[LLMCall], None]:
    """A planner listener that reports each LLM call as a short ``llm_call`` event."""

    def listen(record: LLMCall) -> None:
        usage = record.get("usage") or {}
        answer = " ".join(str(record.get("answer") or "").split())
        try:
            say("llm_call", step=record.get("step"), model=record.get("model"), seconds=record.get("seconds"),
                tokens=int(usage.get("prompt_tokens", 0)) + int(usage.get("completion_tokens", 0)),
                error=(str(record["error"])[:200] if record.get("error") else None),
                summary=answer[:240] + ("…" if len(answer) > 240 else ""))
        except Exception as exc:  # a listener must not raise (the planner's contract)
            log.warning("could not record the planner call %s as an event: %s", record.get("step"), exc)

    return listen
