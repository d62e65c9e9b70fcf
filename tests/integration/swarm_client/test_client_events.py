"""client.events(): the live SSE stream, parsed as protocol.Event, resumable by Last-Event-ID."""

from __future__ import annotations

import itertools
import threading

from swarm.client import SwarmClient, SwarmHTTPError
from swarm.protocol import Event


def _read_until_finished(client: SwarmClient, episode_id: list[str], out: list[Event], done: threading.Event,
                         last_id: int) -> None:
    try:
        for event in client.events(last_event_id=last_id, reconnect=False):
            out.append(event)
            if event.type == "episode.finished" and episode_id and event.data.get("episode_id") == episode_id[0]:
                break
    except SwarmHTTPError as exc:
        out.append(Event(id=-exc.status, type="http-error", time=0.0))
    done.set()


def test_events_stream_shows_an_episode_and_resumes_after_an_id(client: SwarmClient) -> None:
    episode_id: list[str] = []
    seen: list[Event] = []
    done = threading.Event()
    # Start from id 0 so the replay covers events published before the stream connected.
    threading.Thread(target=_read_until_finished, args=(client, episode_id, seen, done, 0), daemon=True).start()
    with client.episode("t-events") as ep:
        episode_id.append(ep.episode_id)
        ep.finish(0.5)
    assert done.wait(30), f"no episode.finished event for {ep.episode_id}; got {[e.type for e in seen][-10:]}"
    finished = seen[-1]  # an HTTP error from the route (a 404 if it went) fails here, never skips
    assert finished.type == "episode.finished" and finished.data["reward"] == 0.5
    assert all(b.id > a.id for a, b in itertools.pairwise(seen))  # monotonically increasing ids

    replay: list[Event] = []
    again = threading.Event()
    threading.Thread(target=_read_until_finished, args=(client, episode_id, replay, again, finished.id - 1),
                     daemon=True).start()
    assert again.wait(30)
    assert [e.id for e in replay] == [finished.id]  # resumed exactly after the given id
