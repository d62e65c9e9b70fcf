"""Drift repair on a real BPE tokenizer: 200 four-turn tool-loop episodes on ``tiny-bpe`` at
temperature 1.0, where sampled ids are often not the canonical encoding of their own text.

The client is an ordinary agent loop (``tool_loop``). Every episode must stay one timeline whose
generated tokens are exactly the ids and log-probs that were sampled; an agent that edits an earlier
turn forks, and that is counted. (The same loop runs on ``--engine vllm`` in
tests/e2e/engines/test_vllm_tools.py.)
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.tool_loop import LOOKUP, assert_one_exact_timeline, non_canonical, tool_loop

pytestmark = pytest.mark.slow

EPISODES = 200


def test_tool_loops_on_a_real_bpe_stay_one_exact_timeline(bpe_model: Path, start_server) -> None:
    # The episodes stay open until they are inspected: a lease longer than the whole run, so none
    # expires (and loses its trace) while 200 loops share a busy machine.
    server = start_server(model_dir=bpe_model, group_size=4, min_group_size=1, batch_groups=4096,
                          max_inflight_per_key=4, lease_s=3600)
    with ThreadPoolExecutor(max_workers=16) as pool:
        loops = list(pool.map(lambda i: tool_loop(server.url, server.token, i), range(EPISODES)))
    text = server.core.generator.text
    unrepeatable = repaired = 0
    for loop in loops:
        trace = server.core.lifecycle.get(loop.episode_id).trace
        assert_one_exact_timeline(loop, trace.timelines, trace.drift_forks)
        unrepeatable += non_canonical(text, loop)
        repaired += trace.drift_repaired
    calls = sum(len(loop.sampled) for loop in loops)
    print(f"\n{EPISODES} episodes, {calls} calls: {unrepeatable} sampled replies were not the canonical "
          f"encoding of their text; {repaired} of {calls - EPISODES} follow-up calls were repaired; 0 forks")
    assert unrepeatable >= EPISODES // 4 and repaired >= unrepeatable // 2

    # An agent that edits an earlier turn really changed its history: a fork, counted.
    loop = loops[0]
    edited = [dict(m) for m in loop.messages]
    edited[1] = {**edited[1], "content": "an edited reply"}
    loop.llm.chat.completions.create(model="policy", messages=edited, tools=[LOOKUP], max_tokens=4)
    trace = server.core.lifecycle.get(loop.episode_id).trace
    assert trace.drift_forks == 1 and len(trace.timelines) == 2
