"""SwarmTeam: one rollout's episodes (one per role) finish together or abort together.

Both roles point at the shared test server here (a second tiny server would double the setup
time); the team logic only sees two clients, so the behaviour is the same as with two servers.
"""

from __future__ import annotations

import pytest
from support import ServeProcess

from swarm.client import SwarmClient, SwarmTeam
from swarm.protocol import EpisodeState


@pytest.fixture
def team(server: ServeProcess) -> SwarmTeam:
    return SwarmTeam({"planner": SwarmClient(server.url, token=server.token),
                      "worker": SwarmClient(server.url, token=server.token)})


def _states(team: SwarmTeam, rollout) -> dict[str, EpisodeState]:
    return {role: team.clients[role].episode_status(ep.episode_id).state for role, ep in rollout.episodes.items()}


def test_rollout_finishes_every_role_with_its_reward(team: SwarmTeam) -> None:
    with team.rollout("team-ok") as rollout:
        plan = rollout["planner"].openai().chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "plan"}], max_tokens=4)
        assert plan.choices
        rollout.finish({"planner": 0.2, "worker": 0.8})
    assert _states(team, rollout) == {"planner": EpisodeState.finished, "worker": EpisodeState.finished}
    assert rollout["worker"].reward == 0.8


def test_an_exception_aborts_every_role(team: SwarmTeam) -> None:
    with pytest.raises(KeyError), team.rollout("team-crash") as rollout:
        raise KeyError("tool missing")
    assert _states(team, rollout) == {"planner": EpisodeState.aborted, "worker": EpisodeState.aborted}


def test_rewards_must_name_exactly_the_roles(team: SwarmTeam) -> None:
    with pytest.raises(ValueError, match="roles"), team.rollout("team-partial") as rollout:
        rollout.finish({"planner": 1.0})
    assert _states(team, rollout) == {"planner": EpisodeState.aborted, "worker": EpisodeState.aborted}
