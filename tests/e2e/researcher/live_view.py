"""The live view of a study, followed across a SIGKILL of its researcher: `researcher watch` on a pipe
and the daemon's SSE endpoint. A helper of test_crash_resume: the study that test kills and resumes is
the one watched and streamed here, so the live view's checks cost no study of their own."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from support import wait_for

from researcher.runs import record as runs
from researcher.study.events import read_events


def sse_events(response: httpx.Response) -> Iterator[dict]:
    """The events of an SSE response, each checked against its `id:` line."""
    fields: dict[str, str] = {}
    for line in response.iter_lines():
        if line == "":
            if "data" in fields:
                event = json.loads(fields["data"])
                assert int(fields["id"]) == event["id"]
                yield event
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            fields[name] = value.lstrip(" ")


class LiveView:
    """A daemon (its SSE server) and a `researcher watch` pipe on one study, from its first event."""

    def __init__(self, cli, tmp_path: Path, sid: str) -> None:
        self.cli, self.sid = cli, sid
        self.events_file = cli.artifacts / sid / "events.jsonl"
        self.daemon_log = tmp_path / "daemon.log"
        self.daemon = cli.popen("daemon", "--port", "0", "--poll", "600", *cli.dirs, log=self.daemon_log)
        self.procs: list[subprocess.Popen] = [self.daemon]
        self.seen: list[tuple[float, str]] = []
        self.first: list[dict] = []
        self.url = ""
        self.auth: dict[str, str] = {}

    def attach(self, study: subprocess.Popen) -> None:
        """Once the study's first event is written: start the watcher, check the SSE endpoint's auth and
        read the first 8 events, then disconnect mid-study."""
        wait_for(self.events_file.exists, 60, what="the study's first event", proc=study, interval=0.2)
        watcher = subprocess.Popen(self.cli.argv("watch", self.sid, *self.cli.dirs), env=self.cli.env, cwd=self.cli.cwd,
                                   text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.procs.append(watcher)
        threading.Thread(target=lambda: self.seen.extend((time.time(), line) for line in watcher.stdout),
                         daemon=True).start()
        address = self.cli.artifacts / "daemon.json"  # the address; the token is in its 0600 file
        wait_for(address.exists, 60, what="the daemon's events server", proc=self.daemon, interval=0.2)
        self.url = json.loads(address.read_text())["url"]
        token_file = self.cli.artifacts / "daemon.token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        self.auth = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
        events = f"{self.url}/studies/{self.sid}/events"
        assert httpx.get(events, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(events).status_code == 401
        assert httpx.get(f"{self.url}/studies/no-such-study/events", headers=self.auth).status_code == 404
        with httpx.stream("GET", events, headers=self.auth, timeout=60) as response:
            assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
            for event in sse_events(response):
                self.first.append(event)
                if len(self.first) == 8:
                    break

    def check_launches_shown_within_5_s(self, study: subprocess.Popen) -> None:
        """A run's launch shows in `researcher watch` within 5 s of its server being started."""
        launched = wait_for(lambda: [(t, line) for t, line in self.seen if " launched " in line], 120,
                            what="a launched run", proc=study, interval=0.2)
        for t_seen, line in launched:
            _, iteration, trial = line.split("key=")[1].split()[0].split("/")
            record = runs.load(self.cli.artifacts / self.sid / "runs" / f"{int(iteration):02d}-{int(trial):02d}")
            assert record is not None, line
            assert t_seen - record.started_at < 5, (t_seen - record.started_at, line)

    def check_after_resume(self, last_id_before: int) -> None:
        """After the resumed study ended: ids increasing with no gap across the restart, the stream resumed
        after its last received event gives the rest exactly, and the watcher saw the resumed session."""
        events = read_events(self.events_file)
        ids = [e["id"] for e in events]
        assert ids == list(range(1, len(ids) + 1))
        [restart] = [e for e in events if e["kind"] == "session" and e["action"] == "resume"]
        assert restart["id"] > last_id_before and events[-1]["kind"] == "node" and events[-1]["phase"] == "done"
        rest: list[dict] = []
        with httpx.stream("GET", f"{self.url}/studies/{self.sid}/events", timeout=30,
                          headers={**self.auth, "Last-Event-ID": str(self.first[-1]["id"])}) as response:
            for event in sse_events(response):
                rest.append(event)
                if event["id"] == ids[-1]:
                    break
        assert [e["id"] for e in self.first + rest] == ids and self.first + rest == events
        if shutil.which("curl"):
            middle = ids[len(ids) // 2]
            curl = subprocess.run(["curl", "-sN", "--max-time", "3", "-H", f"Authorization: {self.auth['Authorization']}",
                                   "-H", f"Last-Event-ID: {middle}", f"{self.url}/studies/{self.sid}/events"],
                                  capture_output=True, text=True)
            got = [int(line[3:]) for line in curl.stdout.splitlines() if line.startswith("id:")]
            assert got == ids[ids.index(middle) + 1:], curl.stdout[-2000:]
        # The watcher, started before the kill, saw the resumed session too; `--once` draws the view (the
        # study picked by default: the only one), at most 100 columns on a pipe.
        wait_for(lambda: any("session action=resume" in line for _, line in self.seen), 10,
                 what="the resumed session in watch", interval=0.2)
        view = self.cli.run("watch", "--once", *self.cli.dirs, timeout=60)
        assert view.returncode == 0, view.stdout + view.stderr
        assert self.sid in view.stdout and "1/0" in view.stdout and "finished" in view.stdout
        assert all(len(line) <= 100 for line in view.stdout.splitlines())
        assert "decided to conclude" in view.stdout

    def close(self) -> None:
        """Stop the watcher and the daemon; the daemon must have exited cleanly."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        assert self.daemon.returncode == 0, self.daemon_log.read_text()[-2000:]
