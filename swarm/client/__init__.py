"""The swarm client: claim episodes on swarm servers, run any OpenAI-speaking agent, post rewards.

Light by design (protocol, httpx and rich; the openai SDK only once an episode asks for a client),
so it runs on a laptop with no torch and starts in well under a second::

    client = SwarmClient("http://127.0.0.1:8000")
    with client.episode("t-17") as ep:
        reply = ep.openai().chat.completions.create(model="policy", messages=[...])
        ep.finish(reward=score(reply))
    client.run(tasks, workflow, group_size=8, concurrency=16)
"""

from swarm.client._client import SwarmClient
from swarm.client._episode import EpisodeHandle
from swarm.client._errors import SwarmError, SwarmHTTPError, SwarmUnavailable
from swarm.client._probe import ProbeReport, probe_study
from swarm.client._run_state import Task
from swarm.client._runner import RunSummary
from swarm.client._study import RewardRecord, run_study, run_study_cli
from swarm.client._study_module import load_study
from swarm.client._team import SwarmTeam, TeamRollout

__all__ = [
    "EpisodeHandle",
    "ProbeReport",
    "RewardRecord",
    "RunSummary",
    "SwarmClient",
    "SwarmError",
    "SwarmHTTPError",
    "SwarmTeam",
    "SwarmUnavailable",
    "Task",
    "TeamRollout",
    "load_study",
    "probe_study",
    "run_study",
    "run_study_cli",
]
