"""Digits: reverse a 3-digit number. A study that ships a supervised warm-up.

From random initialisation the tiny model almost never emits a well-formed answer, so GRPO has no
signal. ``setup`` therefore runs a supervised warm-up on a fresh server (``client.sft``, 200
steps), after which the partial-credit reward (the fraction of digits in the right place, less a
penalty for a wrong length) gives GRPO a gradient to climb. ``heldout()`` is 32 fixed numbers that
neither the warm-up nor ``tasks`` ever uses (there are only 1000 numbers, so both skip them);
``swarm run`` evaluates them every ``EVAL_EVERY`` steps (``eval/*`` metrics). Run it with::

    swarm serve --model tiny --config studies/examples/digits/config.toml
    swarm run studies/examples/digits/client.py --server http://127.0.0.1:8000
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator

from swarm.client import EpisodeHandle, SwarmClient, run_study_cli

log = logging.getLogger(__name__)

GROUP_SIZE = 8
CONCURRENCY = 32
DIGITS = 3
WARMUP_STEPS = 200
WARMUP_LR = 3e-3
WARMUP_EXAMPLES = 512
EVAL_EVERY = 5  # steps between held-out evaluations
HELDOUT_SIZE = 32
REWARD_RANGE = (0.0, 1.0)  # digits in place (at most all), less a length penalty, floored at 0


def _prompt(number: str) -> list[dict]:
    return [{"role": "user", "content": f"reverse {number}"}]


def _number(rng: random.Random) -> str:
    return "".join(rng.choice("0123456789") for _ in range(DIGITS))


def _heldout_numbers() -> list[str]:
    return [f"{n:0{DIGITS}d}" for n in random.Random("digits-heldout").sample(range(10**DIGITS), HELDOUT_SIZE)]


def _numbers(rng: random.Random) -> Iterator[str]:
    """Random numbers, never a held-out one."""
    held = set(_heldout_numbers())
    while True:
        number = _number(rng)
        if number not in held:
            yield number


def heldout() -> list[dict]:
    """The fixed held-out numbers (their own RNG stream; excluded from the warm-up and from tasks)."""
    return [{"task_id": f"digits-heldout-{i}", "number": n} for i, n in enumerate(_heldout_numbers())]


def setup(client: SwarmClient) -> None:
    """Teach the answer format with a supervised warm-up, once per server (not on client restarts)."""
    if client.status().policy_version > 0:
        log.info("server already trained (policy version > 0): skipping the warm-up")
        return
    stream = _numbers(random.Random(12345))  # warm-up numbers differ from the RL stream's seeds in practice
    numbers = [next(stream) for _ in range(WARMUP_EXAMPLES)]
    result = client.sft([{"messages": _prompt(n), "completion": n[::-1]} for n in numbers],
                        steps=WARMUP_STEPS, batch_size=16, lr=WARMUP_LR)
    log.info("warm-up: %d steps, loss %.3f -> %.3f", result.steps, result.loss_first, result.loss_last)


def tasks(seed: int) -> Iterator[dict]:
    for index, number in enumerate(_numbers(random.Random(seed))):
        yield {"task_id": f"digits-{seed}-{index}", "number": number}


def reward(answer: str, number: str) -> float:
    """Partial credit: digits in the right place, minus 0.25 per character of wrong length."""
    target = number[::-1]
    answer = answer.strip()
    correct = sum(a == b for a, b in zip(answer, target)) / len(target)
    return max(0.0, correct - 0.25 * abs(len(answer) - len(target)))


def workflow(ep: EpisodeHandle, task: dict) -> float:
    reply = ep.openai().chat.completions.create(model="policy", messages=_prompt(task["number"]),
                                                max_tokens=DIGITS + 4, temperature=1.0)
    return reward(reply.choices[0].message.content or "", task["number"])


if __name__ == "__main__":
    run_study_cli(__file__)
