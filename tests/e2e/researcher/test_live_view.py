"""The live view of a study: its event log, `researcher watch` and the daemon's SSE endpoint.

Real processes: writers racing on one log. The live view of a real study, followed across a SIGKILL of
its researcher by `researcher watch` and the daemon's SSE stream, is checked on test_crash_resume's
study (live_view.py), so that it costs no study of its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from researcher.study.events import EventLog, Follower, llm_call_listener, read_events, recorder
from researcher.study.layout import StudyLayout

_WRITER = """
import sys
from pathlib import Path

from researcher.study.events import EventLog
log = EventLog(Path(sys.argv[1]))
for i in range(int(sys.argv[3])):
    log.append("tick", writer=sys.argv[2], n=i, pad="x" * 3000)
"""


def test_two_processes_append_whole_lines_with_increasing_ids(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    writers = [subprocess.Popen([sys.executable, "-c", _WRITER, str(path), name, "150"]) for name in ("a", "b")]
    assert [w.wait(60) for w in writers] == [0, 0]
    lines = path.read_text().splitlines()
    events = [json.loads(line) for line in lines]  # every line whole: no two writes interleaved
    assert [e["id"] for e in events] == list(range(1, 301))
    assert sorted(e["n"] for e in events if e["writer"] == "a") == list(range(150))


def test_a_torn_last_line_is_never_read_and_ids_go_on(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    for n in range(3):
        log.append("tick", n=n)
    follower = Follower(path)
    assert [e["id"] for e in follower.poll()] == [1, 2, 3]
    with open(path, "a") as out:
        out.write('{"id": 4, "ts": 1.0, "kind": "tic')  # a writer SIGKILLed mid-line
    assert follower.poll() == [] and read_events(path) == read_events(path, 0)[:3]
    assert EventLog(path).append("tick", n=3)["id"] == 4  # a new process (a restart) goes on from the last whole id
    assert [e["id"] for e in follower.poll()] == [4]
    assert [e["id"] for e in read_events(path)] == [1, 2, 3, 4] and [e["id"] for e in read_events(path, 2)] == [3, 4]


def test_llm_calls_become_short_events(tmp_path: Path) -> None:
    layout = StudyLayout("s", tmp_path / "studies", tmp_path / "artifacts")
    printed: list[str] = []
    emit = recorder(layout, lambda kind, data: printed.append(kind))
    listen = llm_call_listener(lambda kind, **data: emit(kind, data))
    listen({"step": "decide", "model": "m", "answer": '{"action": "conclude", "reason": "' + "r" * 400 + '"}',
            "error": None, "usage": {"prompt_tokens": 120, "completion_tokens": 30}, "seconds": 1.5})
    emit("decided", {"action": "conclude", "reason": "resolved"})
    call, decided = read_events(layout.artifacts_dir / "events.jsonl")
    assert call["kind"] == "llm_call" and call["step"] == "decide" and call["tokens"] == 150
    assert call["summary"].startswith('{"action": "conclude"') and len(call["summary"]) <= 241
    assert decided["reason"] == "resolved" and printed == ["decided"]  # the terminal printer is not flooded


def test_the_view_folds_events_into_node_decisions_runs_and_recent() -> None:
    from rich.console import Console

    from researcher.operations.watch import WatchState, render, sparkline

    state = WatchState("s")
    for n, (kind, fields) in enumerate([
            ("node", {"action": "enter", "node": "monitor", "doing": "polling live runs", "phase": "running"}),
            ("decided", {"action": "continue", "reason": "the difference is not resolved"}),
            ("launched", {"key": "s/1/0", "experiment": "arm-a", "seed": 1000}),
            ("progress", {"key": "s/1/0", "step": 1, "target": 4, "reward": None, "train_reward": 0.1}),
            ("progress", {"key": "s/1/0", "step": 2, "target": 4, "reward": 0.3, "train_reward": 0.3}),
            ("watchdog", {"name": "client_stuck", "key": "s/1/0", "step": 2}),
            ("parked", {"reason": "the session window ended", "phase": "running", "runs": 1})], start=1):
        state.apply({"id": n, "ts": 1000.0 + n, "kind": kind, **fields})
    assert state.node == "monitor" and state.runs["s/1/0"].rewards == [0.1, 0.3]
    assert state.runs["s/1/0"].status == "parked"
    console = Console(record=True, width=160)
    console.print(render(state, now=1010.0))
    text = console.export_text()
    for expected in ("monitor for 9 s", "polling live runs", "decided to continue: the difference is not resolved",
                     "1/0", "2/4", "0.300", "watchdog client_stuck: 1/0", "parked in phase running"):
        assert expected in text, expected
    assert sparkline([0.0, 0.5, 1.0]) == "▁▄█" and sparkline([]) == ""

    # A node that has left no longer counts up: the view says when it left.
    state.apply({"id": 8, "ts": 1012.0, "kind": "node", "action": "leave", "node": "monitor", "phase": "analyzing"})
    console = Console(record=True, width=160)
    console.print(render(state, now=2000.0))
    text = console.export_text()
    assert "monitor, left at " in text and " for " not in text.split("doing")[0], text
    assert "done (phase now analyzing)" in text


def test_at_80_columns_arms_stay_apart_and_curves_share_one_step_axis() -> None:
    from rich.console import Console

    from researcher.operations.terminal import distinct, fit
    from researcher.operations.watch import WatchState, render

    study = "does-a-larger-grpo-group-size-make-the-letters-task-learn-faster-20261127-0934"
    state = WatchState(study)
    arms = {f"{study}/2/0": "it2-group-size-16-learning-rate-0.001", f"{study}/2/1": "it2-group-size-8-learning-rate-0.001"}
    n = 0
    for key, arm in arms.items():
        n += 1
        state.apply({"id": n, "ts": 1000.0 + n, "kind": "launched", "key": key, "experiment": arm, "seed": 1000})
    for key, last in zip(arms, (20, 10)):  # the first arm is twice as far along as the second
        for step in range(1, last + 1):
            n += 1
            state.apply({"id": n, "ts": 1000.0 + n, "kind": "progress", "key": key, "step": step, "target": 40,
                         "reward": step / 20})
    console = Console(record=True, width=80)
    console.print(render(state, now=1100.0, width=80))
    text = console.export_text()
    assert "2/0" in text and "2/1" in text and study + "/" not in text  # the header names the study once
    short = distinct(list(arms.values()), 16)
    assert short[arms[f"{study}/2/0"]] == "…size-16…" and short[arms[f"{study}/2/1"]] == "…size-8…"
    assert "…size-16…" in text and "…size-8…" in text
    assert all(len(line) <= 80 for line in text.splitlines())
    assert fit("does-a-larger-group-make-it-learn-faster", 20) == "does-a-lar…rn-faster" and fit("short", 20) == "short"


def test_step_curves_align_runs_by_step() -> None:
    from researcher.operations.watch import RunView, step_curves

    ahead = RunView(key="a", points=[(s, s / 10) for s in range(1, 11)])
    behind = RunView(key="b", points=[(s, s / 10) for s in range(1, 6)])
    curves = step_curves([ahead, behind], width=10)
    assert len(curves["a"]) == 10 and len(curves["b"]) == 5  # the same steps, the same columns
    assert curves["a"][:5] == curves["b"]  # equal rewards at equal steps draw the same bars
