"""An ordinary agent tool loop against a swarm server, shared by the drift-repair tests of both engines.

The loop re-sends every reply as the server returned it (content and parsed tool calls), answers each
call with a tool message (or, when the reply called nothing, with a user message), and keeps what was
sampled so a test can check the server recorded exactly that.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx
import openai
import pytest

LOOKUP = {"type": "function", "function": {
    "name": "lookup", "description": "Look a word up.",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}}


@dataclass
class Loop:
    episode_id: str
    llm: openai.OpenAI
    messages: list[dict] = field(default_factory=list)
    sampled: list[tuple[list[int], list[float]]] = field(default_factory=list)  # per call: ids, log-probs


def tool_loop(url: str, token: str, index: int, *, turns: int = 4, max_tokens: int = 10) -> Loop:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        episode = http.post("/api/v1/episodes", json={"task_id": f"t{index}"}).json()
    loop = Loop(episode["episode_id"], openai.OpenAI(base_url=episode["base_url"], api_key=episode["api_key"],
                                                     max_retries=0),
                [{"role": "user", "content": f"Look up word number {index}."}])
    for turn in range(turns):
        reply = loop.llm.chat.completions.create(model="policy", messages=loop.messages, tools=[LOOKUP],
                                                 temperature=1.0, max_tokens=max_tokens, logprobs=True,
                                                 seed=1000 * index + turn)
        choice = reply.choices[0]
        loop.sampled.append((choice.model_extra["token_ids"], [lp.logprob for lp in choice.logprobs.content]))
        calls = [c.model_dump() for c in choice.message.tool_calls or []]
        loop.messages.append({"role": "assistant", "content": choice.message.content, "tool_calls": calls or None})
        loop.messages += [{"role": "tool", "tool_call_id": c["id"], "content": "a word"} for c in calls] or \
            [{"role": "user", "content": f"go on ({turn})"}]
    return loop


def assert_one_exact_timeline(loop: Loop, timelines: list, drift_forks: int) -> None:
    """The episode is one timeline whose generated tokens are exactly what was sampled, in order."""
    assert len(timelines) == 1 and drift_forks == 0, (len(timelines), drift_forks)
    [timeline] = timelines
    generated = [(t, lp) for t, m, lp in zip(timeline.tokens, timeline.loss_mask, timeline.logprobs) if m]
    assert [t for t, _ in generated] == [t for ids, _ in loop.sampled for t in ids]
    assert [lp for _, lp in generated] == pytest.approx([lp for _, lps in loop.sampled for lp in lps], abs=1e-6)


def non_canonical(text, loop: Loop) -> int:
    """Replies whose sampled ids are not the tokenizer's own encoding of their text."""
    return sum(text.encode(text.decode(ids)) != ids for ids, _ in loop.sampled)
