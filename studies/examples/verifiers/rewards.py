"""Post each verifiers rollout's reward to the swarm episode it ran in: the rollout's trace id is the
X-Session-ID verifiers sent on its every call, so the run key names the episode by it."""
import json
import os
import sys
from pathlib import Path

import httpx

api = httpx.Client(base_url=os.environ["SWARM_URL"], headers={"Authorization": "Bearer " + os.environ["SWARM_RUN_KEY"]})
lines = Path(sys.argv[1]).read_text().splitlines()
for trace in (t for line in lines if line.strip() for t in json.loads(line)["traces"]):
    reward = sum(r["score"] * r["weight"] for r in trace["rewards"].values() if r) if trace["ok"] else None
    done = {"reward": reward} if reward is not None else {"reason": f"rollout failed: {trace['errors']}"[:500]}
    verb = "finish" if reward is not None else "abort"
    api.post(f"/api/v1/episodes/{trace['id']}/{verb}", json=done).raise_for_status()
