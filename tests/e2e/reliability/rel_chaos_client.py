"""A swarm client process for the chaos test and the load benchmark (run as a script, not collected).

Loops claim → one chat call through the openai SDK → finish until ``--stop-file`` exists (the test
says when it has seen enough) or, as a backstop, ``--seconds`` pass, and appends one JSON line per
outcome to ``--log`` (flushed, so a SIGKILL loses nothing already written):
``{"finished": id}`` only after ``finish`` returned, ``{"failed": kind, "error": text}`` otherwise.
Once ``--hold-file`` exists, the client stays inside its current episode after the chat call (it logs
``{"holding": id}`` and never finishes it): a test that wants it killed mid-episode kills it then.
Uses the real ``SwarmClient`` (retries and reconnects across a server restart).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from swarm.client import SwarmClient


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--client-id", required=True)
    parser.add_argument("--seconds", type=float, required=True, help="stop after this long at the latest")
    parser.add_argument("--stop-file", type=Path, default=None, help="stop (after the current episode) once it exists")
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--pause", type=float, default=0.0, help="sleep inside each episode (to be killed there)")
    parser.add_argument("--hold-file", type=Path, default=None,
                        help="once it exists, stay inside the current episode until killed")
    args = parser.parse_args()
    deadline = time.monotonic() + args.seconds
    n = 0
    with SwarmClient(args.url, args.token, client_id=args.client_id, retry_for_s=60) as client, \
            open(args.log, "a", buffering=1) as log:
        while time.monotonic() < deadline and not (args.stop_file and args.stop_file.exists()):
            n += 1
            group = (n - 1) // args.group_size  # consecutive episodes form one GRPO group
            try:
                with client.episode(task_id=f"task-{group % args.tasks}", group_id=f"{args.client_id}-g{group}",
                                    group_size=args.group_size) as ep:
                    log.write(json.dumps({"claimed": ep.episode_id, "t": time.time()}) + "\n")
                    llm = ep.openai(max_retries=0)
                    reply = llm.chat.completions.create(
                        model="tiny", messages=[{"role": "user", "content": f"say a {n}"}], max_tokens=8)
                    if args.pause:
                        time.sleep(args.pause)
                    if args.hold_file and args.hold_file.exists():
                        log.write(json.dumps({"holding": ep.episode_id, "t": time.time()}) + "\n")
                        while True:  # until the test's SIGKILL
                            time.sleep(1)
                    text = reply.choices[0].message.content or ""
                    ep.finish(reward=text.count("a") / 8.0)
                log.write(json.dumps({"finished": ep.episode_id, "t": time.time()}) + "\n")
            except Exception as exc:  # the server restarted under us: log it and go on
                log.write(json.dumps({"failed": type(exc).__name__, "error": str(exc)[:300], "t": time.time()}) + "\n")
                time.sleep(0.2)


if __name__ == "__main__":
    main()
