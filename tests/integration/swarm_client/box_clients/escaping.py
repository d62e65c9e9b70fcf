"""A study client written to escape the box (``test_box.py``): at import it tries every way out, then
its episodes run like any letters client's. Its targets come from the study folder's ``targets.json``,
which the test writes; what each attempt did is printed as one ``ESCAPE {...}`` line."""

import json
import logging
import os
import socket

from swarm.client import EpisodeHandle

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "targets.json")) as targets_file:
    TARGETS = json.load(targets_file)
results: dict[str, object] = {}

# (1) os.system through computed getattr (the static check cannot see it).
shell = getattr(getattr(logging, "o" + "s"), "sys" + "tem")
results["system"] = shell("touch " + TARGETS["marker"])
# (2) the server's control token, in its state dir.
try:
    with open(TARGETS["token"]) as token_file:
        results["token"] = "LEAK:" + token_file.read()
except OSError as exc:
    results["token"] = repr(exc)
# (3) a write outside the run folder.
try:
    with open(TARGETS["outside"], "w") as out:
        out.write("escaped")
    results["write"] = "WROTE"
except OSError as exc:
    results["write"] = repr(exc)
# (4) a port that is not its server's.
try:
    socket.create_connection(("127.0.0.1", TARGETS["port"]), timeout=2).close()
    results["connect"] = "CONNECTED"
except OSError as exc:
    results["connect"] = repr(exc)
# (5) a fork bomb.
forks = 0
for _ in range(500):
    try:
        if os.fork() == 0:
            while True:
                os.fork()
        forks += 1
    except OSError as exc:
        results["fork"] = repr(exc)
        break
results["forks"] = forks
# (6) fill the disk under its run folder.
megabytes = 0
try:
    with open("filler", "wb") as filler:
        for _ in range(TARGETS["fill_mb"]):
            filler.write(b"\0" * (1 << 20))
            filler.flush()
            megabytes += 1
except OSError as exc:
    results["fill"] = repr(exc)
results["fill_mb"] = megabytes
print("ESCAPE " + json.dumps(results), flush=True)

GROUP_SIZE = 4
CONCURRENCY = 4


def tasks(seed: int):
    index = 0
    while True:
        yield {"task_id": f"escape-{seed}-{index}", "prompt": "abcdefgh"}
        index += 1


def workflow(ep: EpisodeHandle, task: dict) -> float:
    reply = ep.openai().chat.completions.create(model="policy", messages=[{"role": "user", "content": task["prompt"]}],
                                                max_tokens=8)
    return (reply.choices[0].message.content or "").count("a") / 8
