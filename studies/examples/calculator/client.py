"""Calculator: multi-turn tool use, 4-6 model calls per episode, small enough for the tiny model.

The user gives a start value and the first operation (``7 +3``). The model calls the calculator
with a compact call, ``<tool_call>7+3</tool_call>`` (``<tool_call>``/``</tool_call>`` are single
tokens of the tiny tokenizer), the workflow evaluates it (no ``eval``) and replies with a ``tool``
message holding the result and the next operation (``=10 *2``), until the reply says ``done``
(``=20 done``) and the model answers with the final number (``20``). Each call re-sends the whole
history with the model's replies verbatim, so the server merges an episode's calls into one token
timeline (``context/samples_per_episode`` near 1).

Every turn is short on purpose: the tiny model is byte-level (one token per character) and pays for
every byte of history on every call and in training. For the same reason no ``tools=[...]`` are
declared: the chat template's tool preamble alone is ~330 tokens, about as long as a whole episode.
The tool results still flow through the template (``role: tool`` renders as ``<tool_response>``).

Reward (partial credit, so GRPO can climb from an imperfect warm-up): 0.6 × the fraction of
operations called right (half for the operator, half for the operand) + 0.1 × the fraction of turns
that were well-formed calls + 0.3 × the final answer repeating the tool's last result. Each skill is
scored on its own: a wrong call already costs its share, so it does not also zero the answer.
``setup`` runs a short supervised warm-up on correct trajectories on a fresh server (a random tiny
model cannot produce the call syntax); it leaves the policy imperfect, and GRPO improves it (see
README.md for measured curves). ``heldout()`` is 16 fixed problems from their own RNG stream, which
neither ``tasks`` nor the warm-up ever yields; ``swarm run`` evaluates them every ``EVAL_EVERY``
steps (``eval/*`` metrics). Run it with::

    swarm serve --model tiny --config studies/examples/calculator/config.toml
    swarm run studies/examples/calculator/client.py --server http://127.0.0.1:8000
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Iterator

from swarm.client import EpisodeHandle, SwarmClient, run_study_cli

log = logging.getLogger(__name__)

GROUP_SIZE = 8
CONCURRENCY = 16  # two groups in flight: the server batches their calls into one forward pass
MIN_OPS, MAX_OPS = 3, 5  # tool calls per episode; plus the final answer: 4-6 model calls
MAX_TURNS = 8  # a malformed call is answered with an error and retried, up to this many calls
MAX_TOKENS = 16  # a call is ~8 tokens; a longer reply is wrong anyway
WARMUP_TRAJECTORIES = 400
WARMUP_STEPS = 100
WARMUP_BATCH = 16
WARMUP_LR = 3e-3
EVAL_EVERY = 5  # steps between held-out evaluations
HELDOUT_SIZE = 16  # each is 4-6 calls: as many episodes as one training step
REWARD_RANGE = (0.0, 1.0)  # 0.6 calls + 0.1 well-formed + 0.3 answer, each a fraction or 0/1

_CALL = re.compile(r"^\s*<tool_call>\s*(.*?)\s*</tool_call>\s*$", re.DOTALL)
_EXPR = re.compile(r"^(-?\d+)([+*-])(\d+)$")


# ---------------------------------------------------------------------------- the environment


def _ops(rng: random.Random) -> list[str]:
    ops = []
    for _ in range(rng.randint(MIN_OPS, MAX_OPS)):
        op = rng.choice("+-*")
        ops.append(f"{op}{rng.randint(2, 3) if op == '*' else rng.randint(1, 9)}")
    return ops


def calc(expr: str) -> int | None:
    """The tool: ``a+b``, ``a-b`` or ``a*b`` on integers (no ``eval``); ``None`` if malformed."""
    match = _EXPR.match(expr.replace(" ", ""))
    if match is None:
        return None
    a, op, b = int(match[1]), match[2], int(match[3])
    if abs(a) > 10**6 or b > 10**6:  # keeps a runaway policy from building huge numbers
        return None
    return a + b if op == "+" else a - b if op == "-" else a * b


def parse_call(text: str) -> str | None:
    """The operation of a well-formed ``<tool_call>*3</tool_call>`` reply, else ``None``."""
    match = _CALL.match(text)
    if match is None or calc(f"0{match[1]}") is None:
        return None
    return match[1].replace(" ", "")


def call_text(expr: str) -> str:
    return f"<tool_call>{expr}</tool_call>"


def tool_text(result: int | str, next_op: str | None) -> str:
    return f"={result} {next_op if next_op is not None else 'done'}"


def first_messages(start: int, ops: list[str]) -> list[dict]:
    return [{"role": "user", "content": tool_text(start, ops[0])}]


# ---------------------------------------------------------------------------- the study


def _problems(rng: random.Random) -> Iterator[tuple[int, list[str]]]:
    """Random (start, operations) problems, never a held-out one."""
    held = {(task["start"], tuple(task["ops"])) for task in heldout()}
    while True:
        start, ops = rng.randint(1, 20), _ops(rng)
        if (start, tuple(ops)) not in held:
            yield start, ops


def heldout() -> list[dict]:
    """The fixed held-out problems: their own RNG stream (a string seed, never an int ``tasks`` seed)."""
    rng = random.Random("calc-heldout")
    return [{"task_id": f"calc-heldout-{i}", "start": rng.randint(1, 20), "ops": _ops(rng)}
            for i in range(HELDOUT_SIZE)]


def tasks(seed: int) -> Iterator[dict]:
    for index, (start, ops) in enumerate(_problems(random.Random(seed))):
        yield {"task_id": f"calc-{seed}-{index}", "start": start, "ops": ops}


def calls_right(ops: list[str], calls: list[str | None]) -> float:
    """Fraction of the operations called right; the n-th well-formed call answers the n-th operation.

    Half credit for the right operator, half for the right operand: a denser signal for GRPO.
    """
    made = [call for call in calls if call is not None]
    return sum(0.5 * (call[0] == op[0]) + 0.5 * (call[1:] == op[1:]) for call, op in zip(made, ops)) / len(ops)


def answer_right(answer: str | None, told: int | None) -> bool:
    """The final reply repeats the tool's last result (``None``: never answered / tool error)."""
    return answer is not None and told is not None and answer.strip() == str(told)


def score(ops: list[str], calls: list[str | None], answer: str | None, told: int | None) -> float:
    """The episode's reward: ``calls`` holds each call turn's parsed operation (``None`` when
    malformed), ``answer`` the final reply (``None`` if never reached), ``told`` the tool's last result."""
    wellformed = sum(call is not None for call in calls) / max(len(calls), 1)
    return 0.6 * calls_right(ops, calls) + 0.1 * wellformed + 0.3 * answer_right(answer, told)


def workflow(ep: EpisodeHandle, task: dict) -> float:
    llm = ep.openai()
    ops: list[str] = task["ops"]
    told: int | None = task["start"]  # the tool's last result: what the model was last told
    messages = first_messages(task["start"], ops)
    calls: list[str | None] = []
    answer: str | None = None
    done = 0  # operations applied so far
    for _ in range(MAX_TURNS):
        reply = llm.chat.completions.create(model="policy", messages=messages, max_tokens=MAX_TOKENS)
        text = reply.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": text})  # verbatim: keeps the timeline append-only
        if done == len(ops):  # every operation applied: this turn is the final answer
            answer = text
            break
        call = parse_call(text)
        calls.append(call)
        if call is None:
            messages.append({"role": "tool", "content": tool_text("error", ops[done])})
            continue
        told = calc(f"{told}{call}") if told is not None else None
        done += 1
        messages.append({"role": "tool", "content": tool_text(told if told is not None else "error",
                                                               ops[done] if done < len(ops) else None)})
    reward = score(ops, calls, answer, told)
    ep.finish(reward, metrics={"turns": float(len(calls) + (answer is not None)),
                               "calls_right": calls_right(ops, calls),
                               "answer_right": float(answer_right(answer, told))})
    return reward


def warmup_examples(rng: random.Random, trajectories: int) -> list[dict]:
    """One supervised example per correct trajectory: a random turn (history so far -> the reply)."""
    examples = []
    problems = _problems(rng)
    for _ in range(trajectories):
        start, ops = next(problems)
        messages = first_messages(start, ops)
        value = start
        turns: list[tuple[list[dict], str]] = []
        for i, op in enumerate(ops):
            call = call_text(op)
            turns.append((list(messages), call))
            value = calc(f"{value}{op}")
            messages = [*messages, {"role": "assistant", "content": call},
                        {"role": "tool", "content": tool_text(value, ops[i + 1] if i + 1 < len(ops) else None)}]
        turns.append((messages, str(value)))
        history, completion = rng.choice(turns)
        examples.append({"messages": history, "completion": completion})
    return examples


def setup(client: SwarmClient) -> None:
    """Teach the call format once per server (skipped when the server has trained already)."""
    if client.status().policy_version > 0:
        log.info("server already trained (policy version > 0): skipping the warm-up")
        return
    examples = warmup_examples(random.Random(4242), WARMUP_TRAJECTORIES)
    result = client.sft(examples, steps=WARMUP_STEPS, batch_size=WARMUP_BATCH, lr=WARMUP_LR)
    log.info("warm-up on %d examples: %d steps, loss %.3f -> %.3f", len(examples), result.steps,
             result.loss_first, result.loss_last)


if __name__ == "__main__":
    run_study_cli(__file__)
