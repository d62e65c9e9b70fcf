"""Lowercase: letters adapted for a factorial. Prompt: 8 random letters; reward: the fraction of
lowercase letters (a-z) among the 16 sampled tokens (the tiny model is byte-level: a token is a byte).

``FACTORS["prompt"]`` is the client-side factor: ``"plain"`` sends the letters alone, ``"hint"``
prefixes them with ``lowercase:``. A randomly initialised tiny model writes about one lowercase
letter in 16 tokens, differently in each sample, so rewards vary within a group from the start and
GRPO raises them within a few steps. ``heldout()`` is 32 fixed prompts from their own RNG stream,
never yielded by ``tasks``. Run it with::

    swarm serve --model tiny --config studies/examples/letters/config.toml
    swarm run lowercase.py --server http://127.0.0.1:8000
"""

from __future__ import annotations

import random
import string
from collections.abc import Iterator

from swarm.client import EpisodeHandle, run_study_cli

FACTORS = {"prompt": "plain"}  # "plain" or "hint"; the researcher rewrites this line per experiment
PROMPTS = {"plain": "{letters}", "hint": "lowercase: {letters}"}
REWARD_RANGE = (0.0, 1.0)
GROUP_SIZE = 8
CONCURRENCY = 32
COMPLETION_TOKENS = 16
EVAL_EVERY = 5
HELDOUT_SIZE = 32


def _letters(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(8))


def heldout() -> list[dict]:
    """The fixed held-out prompts: their own RNG stream (a string seed, never an int ``tasks`` seed)."""
    rng = random.Random("lowercase-heldout")
    return [{"task_id": f"lowercase-heldout-{i}", "letters": _letters(rng)} for i in range(HELDOUT_SIZE)]


def tasks(seed: int) -> Iterator[dict]:
    """An endless, seed-determined stream of 8 random letters, none of them held out."""
    rng = random.Random(seed)
    held = {task["letters"] for task in heldout()}
    index = 0
    while True:
        letters = _letters(rng)
        if letters not in held:
            yield {"task_id": f"lowercase-{seed}-{index}", "letters": letters}
            index += 1


def reward(text: str) -> float:
    # Capped: the single token `<tool_call>` decodes to 11 characters, 8 of them lowercase.
    return min(1.0, sum(c in string.ascii_lowercase for c in text) / COMPLETION_TOKENS)


def workflow(ep: EpisodeHandle, task: dict) -> float:
    prompt = PROMPTS[FACTORS["prompt"]].format(letters=task["letters"])
    reply = ep.openai().chat.completions.create(model="policy", messages=[{"role": "user", "content": prompt}],
                                                max_tokens=COMPLETION_TOKENS, temperature=1.0)
    return reward(reply.choices[0].message.content or "")


if __name__ == "__main__":
    run_study_cli(__file__)
