"""A server composed explicitly from a torch generator and a separate torch trainer: each new policy
version reaches the generator through an explicit, versioned publication (``weights.published``)
before any completion is tagged with it, and what the generator then serves is the trained weights."""

from __future__ import annotations

from pathlib import Path

import torch
from support import wait_for

from swarm.backends.base import TrainSample
from swarm.backends.torch import TorchBackend
from swarm.backends.torch.training import pack, sequence_logprobs

MESSAGES = [{"role": "user", "content": "say a"}]


def _chat(server, api_key: str) -> dict:
    with server.client(api_key) as http:
        response = http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 8, "logprobs": True,
                                                            "temperature": 1.0})
    assert response.status_code == 200, response.text
    return response.json()


def test_published_version_reaches_the_generator_before_completions_carry_it(start_server, tiny_model: Path) -> None:
    trainer = TorchBackend.from_model(str(tiny_model), seed=0)
    server = start_server(trainer=trainer, group_size=1, min_group_size=1, batch_groups=1, lr=0.05)
    generator = server.core.generator.local
    assert generator.backend is not trainer  # two models: publication is a real copy
    events: list[tuple[str, dict]] = []

    class Recorder:  # a core listener (``ServerCore.add_listener``)
        def on_event(self, type_: str, data: dict) -> None:
            events.append((type_, dict(data)))

    server.core.add_listener(Recorder())

    with server.client() as http:
        episode = http.post("/api/v1/episodes", json={"task_id": "t"}).json()
    before = _chat(server, episode["api_key"])
    assert before["policy_version"] == 0
    with server.client(episode["api_key"]) as http:
        http.post(f"/api/v1/episodes/{episode['episode_id']}/finish", json={"reward": 1.0}).raise_for_status()
    wait_for(lambda: server.core.step == 1)

    published = [d for t, d in events if t == "weights.published"]
    assert [d["policy_version"] for d in published] == [1]
    assert published[0]["sync_s"] >= 0
    assert generator.policy_version == trainer.policy_version == 1
    trained = dict(trainer.model.named_parameters())
    assert all(torch.equal(p, trained[name]) for name, p in generator.backend.model.named_parameters())

    with server.client() as http:
        again = http.post("/api/v1/episodes", json={"task_id": "u"}).json()
    after = _chat(server, again["api_key"])
    assert after["policy_version"] == 1
    # What the generator sampled is scored by the trained weights exactly as it reported.
    prompt, ids = after["prompt_token_ids"], after["choices"][0]["token_ids"]
    reported = [t["logprob"] for t in after["choices"][0]["logprobs"]["content"]]
    sample = TrainSample(tokens=prompt + ids, loss_mask=[0] * len(prompt) + [1] * len(ids),
                         rollout_logprobs=[0.0] * (len(prompt) + len(ids)), advantage=0.0)
    with torch.no_grad():
        logp, _ = sequence_logprobs(trainer.model, pack([sample], 0, trainer.vocab_size, trainer.max_context),
                                    trainer.vocab_size)
    recomputed = logp[0, len(prompt) - 1:].tolist()
    assert max(abs(a - b) for a, b in zip(recomputed, reported, strict=True)) < 1e-4
    metrics = server.core.metrics[0].metrics
    assert "perf/weight_sync_s" in metrics
