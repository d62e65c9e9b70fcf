"""Vowels: count the vowels of a short random word, with a lookup tool; a multi-turn new task.

The user asks ``vowels in kabo?``. A reply holding a digit is the answer (its first digit counts);
any other reply calls the lookup tool, which answers in the next turn with the word's vowels
(``=ao``) when ``FACTORS["tool"]`` is on, or only asks for a number when it is off. At most
``MAX_TURNS`` model calls per episode. Reward (partial credit, so an untrained model's guesses
differ within a group and GRPO has a gradient): 0.2 for answering with a number, plus 0.8 for the
right count, a quarter of that less per unit off; 0 when no number is given. ``heldout()`` is 32
fixed words from their own RNG stream, never yielded by ``tasks``. Run it with::

    swarm serve --model tiny --config studies/examples/letters/config.toml
    swarm run vowels.py --server http://127.0.0.1:8000
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Iterator

from swarm.client import EpisodeHandle, run_study_cli

FACTORS = {"tool": True}  # the researcher rewrites this line with each experiment's levels
REWARD_RANGE = (0.0, 1.0)
GROUP_SIZE = 8
CONCURRENCY = 16
MAX_TURNS = 4
MAX_TOKENS = 8
EVAL_EVERY = 5
HELDOUT_SIZE = 32
VOWELS = "aeiou"
CONSONANTS = "".join(c for c in string.ascii_lowercase if c not in VOWELS)
_DIGIT = re.compile(r"[0-9]")


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(VOWELS if rng.random() < 0.4 else CONSONANTS) for _ in range(rng.randint(4, 6)))


def heldout() -> list[dict]:
    """The fixed held-out words: their own RNG stream (a string seed, never an int ``tasks`` seed)."""
    rng = random.Random("vowels-heldout")
    return [{"task_id": f"vowels-heldout-{i}", "word": _word(rng)} for i in range(HELDOUT_SIZE)]


def tasks(seed: int) -> Iterator[dict]:
    """An endless, seed-determined stream of words, none of them held out."""
    rng = random.Random(seed)
    held = {task["word"] for task in heldout()}
    index = 0
    while True:
        word = _word(rng)
        if word not in held:
            yield {"task_id": f"vowels-{seed}-{index}", "word": word}
            index += 1


def lookup(word: str) -> str:
    """The tool: the word's vowels, in order."""
    return "".join(c for c in word if c in VOWELS)


def guess(text: str) -> int | None:
    """The answer in a reply: its first digit, or ``None`` (the reply is a tool call)."""
    match = _DIGIT.search(text)
    return None if match is None else int(match[0])


def reward(answer: str | None, word: str) -> float:
    """Partial credit for the final reply (``None``: never answered): 0.2 for answering with a number,
    plus 0.8 for the right count, a quarter of it less per unit off."""
    number = None if answer is None else guess(answer)
    if number is None:
        return 0.0
    return 0.2 + 0.8 * max(0.0, 1.0 - abs(number - len(lookup(word))) / 4)


def workflow(ep: EpisodeHandle, task: dict) -> float:
    llm = ep.openai()
    messages = [{"role": "user", "content": f"vowels in {task['word']}?"}]
    answer, calls = None, 0
    for _ in range(MAX_TURNS):
        reply = llm.chat.completions.create(model="policy", messages=messages, max_tokens=MAX_TOKENS,
                                            temperature=1.0)
        text = reply.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": text})  # verbatim: one timeline per episode
        if guess(text) is not None:
            answer = text
            break
        calls += 1
        if FACTORS["tool"]:
            messages.append({"role": "tool", "content": "=" + lookup(task["word"])})
        else:
            messages.append({"role": "user", "content": "a number?"})
    score = reward(answer, task["word"])
    ep.finish(score, metrics={"tool_calls": float(calls), "answered": float(answer is not None)})
    return score


if __name__ == "__main__":
    run_study_cli(__file__)
