"""The gsm-format reward: credit for the answer format, most of it for the right answer.

``score(text, row)`` (``swarm run --reward studies/examples/gsm-format/reward.py:score``):

- 0.2 for a ``#### <n>`` line, plus 0.8 when ``n`` is the right answer (1.0 in all, as gsm8k's
  strict scorer would give);
- else 0.3 when the last number in the reply is right (gsm8k's "flexible" extraction);
- else 0.

Why shaped: with gsm8k's strict scorer alone a sampled SmolLM2-135M reply earns 1 about 2% of the
time, so most groups of 8 are all zeros and GRPO learns nothing (564 episodes, all 0, measured).
Here the model is paid for what it already does half-right (a right last number: ~5%; a ``####``
line: ~17%), every group has a spread, and the largest reward is still only for the exact format
with the right answer, which is what held-out evaluation reports.
"""

from __future__ import annotations

import re

_FORMATTED = re.compile(r"####\s*(-?\d[\d,]*(?:\.\d+)?)")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _number(text: str) -> str:
    return text.replace(",", "").rstrip(".")


def score(text: str, row: dict) -> float:
    """The shaped reward of one reply (see the module docstring)."""
    truth = _number(str(row["ground_truth"]))
    formatted = _FORMATTED.findall(text)
    if formatted:
        return 0.2 + (0.8 if _number(formatted[-1]) == truth else 0.0)
    numbers = _NUMBER.findall(text)
    return 0.3 if numbers and _number(numbers[-1]) == truth else 0.0
