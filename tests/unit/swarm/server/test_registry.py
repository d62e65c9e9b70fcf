"""The engine's in-memory episode registry: claims, idempotent retries, eviction, bounded tombstones."""

from __future__ import annotations

from swarm.server.records.episode import Claim, EpisodeRecord, Group
from swarm.server.records.registry import EpisodeRegistry
from swarm.server.records.timeline import EpisodeTrace


def _episode(episode_id: str) -> EpisodeRecord:
    return EpisodeRecord(episode_id=episode_id, task_id="t", group_key="g#0", group_id="g", category=None,
                         client_id="c", trace=EpisodeTrace(merge=True),
                         claim=Claim(version=0, step=0, lease_s=60.0, expires_at=0.0))


def test_claims_are_found_by_id_and_request_until_evicted() -> None:
    registry, group = EpisodeRegistry(), Group(key="g#0", group_id="g", size=2, category=None)
    a, b = _episode("a"), _episode("b")
    registry.add_claimed(a, group, "req-a")
    registry.add_claimed(b, group, None)
    assert registry.by_request("req-a") is a and registry.by_request("req-b") is None
    assert registry.by_request(None) is None
    assert registry.in_flight == 2 and registry.live() == [a, b] and registry.group_of("b") is group
    assert registry.settle(a) is group and registry.in_flight == 1 and registry.held("a") is a  # finished, not trained
    registry.evict(a)
    assert registry.held("a") is None and registry.get("a") is None
    assert registry.by_request("req-a") is None  # a retried claim after training makes a new episode


def test_closed_episodes_leave_bounded_trace_free_tombstones() -> None:
    registry = EpisodeRegistry(max_tombstones=2)
    group = Group(key="g#0", group_id="g", size=3, category=None)
    episodes = [_episode(name) for name in ("x", "y", "z")]
    for episode in episodes:
        registry.add_claimed(episode, group, None)
        episode.trace.record([1, 2], [([3], [-0.5])], 0, 1.0)
        registry.settle(episode)
        registry.bury(episode)
    assert registry.held("z") is None and registry.get("z") is episodes[2]
    assert registry.get("x") is None and registry.get("y") is episodes[1]  # oldest tombstone dropped first
    assert not episodes[2].trace.samples(0.0)  # the trace was discarded, not kept in memory
