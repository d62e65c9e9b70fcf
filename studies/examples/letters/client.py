"""Letters: the smallest study that visibly learns. Prompt: 8 random letters; reward: the fraction
of 'a' among the 16 sampled tokens (the tiny model is byte-level, so a token is a character).

A randomly initialised tiny model writes almost no 'a' (reward ~0.003); under GRPO it learns to
within a minute on 2 CPU cores. ``heldout()`` is 32 fixed prompts drawn from their own RNG stream,
which ``tasks`` never yields; ``swarm run`` evaluates them every ``EVAL_EVERY`` steps (``eval/*``
metrics). Run it with::

    swarm serve --model tiny --config studies/examples/letters/config.toml
    swarm run studies/examples/letters/client.py --server http://127.0.0.1:8000
"""

from __future__ import annotations

import random
import string
from collections.abc import Iterator

from swarm.client import EpisodeHandle, run_study_cli

GROUP_SIZE = 8  # samples per prompt: GRPO compares them with each other
CONCURRENCY = 32  # four groups in flight, so the server batches them into one forward pass
COMPLETION_TOKENS = 16
REWARD_RANGE = (0.0, 1.0)  # the fraction of 'a': a byte-level token holds at most one
EVAL_EVERY = 5  # steps between held-out evaluations
HELDOUT_SIZE = 32


def _letters(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(8))


def heldout() -> list[dict]:
    """The fixed held-out prompts: their own RNG stream (a string seed, never an int ``tasks`` seed)."""
    rng = random.Random("letters-heldout")
    return [{"task_id": f"letters-heldout-{i}", "prompt": _letters(rng)} for i in range(HELDOUT_SIZE)]


def tasks(seed: int) -> Iterator[dict]:
    """An endless stream of prompts of 8 random lowercase letters, none of them held out."""
    rng = random.Random(seed)
    held = {task["prompt"] for task in heldout()}
    index = 0
    while True:
        letters = _letters(rng)
        if letters in held:
            continue
        yield {"task_id": f"letters-{seed}-{index}", "prompt": letters}
        index += 1


def reward(text: str) -> float:
    return text.count("a") / COMPLETION_TOKENS


def workflow(ep: EpisodeHandle, task: dict) -> float:
    reply = ep.openai().chat.completions.create(
        model="policy",
        messages=[{"role": "user", "content": task["prompt"]}],
        max_tokens=COMPLETION_TOKENS,
        temperature=1.0,
    )
    return reward(reply.choices[0].message.content or "")


if __name__ == "__main__":
    run_study_cli(__file__)
