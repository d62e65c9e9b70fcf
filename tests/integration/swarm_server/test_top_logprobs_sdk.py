"""``top_logprobs`` on the torch engine, through the official openai SDK against a real server and tiny model."""

from __future__ import annotations

import openai
import pytest
import torch

MESSAGES = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Spell abc."}]
TOLERANCE = 1e-4  # cached batched decode vs one plain forward pass: float rounding only


@pytest.fixture
def server(start_server):
    return start_server(group_size=1, min_group_size=1, batch_groups=1000, max_tokens=24)


def _distribution(server, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    """``log_softmax(logits / T)`` at every completion position, from one plain forward pass."""
    backend = server.core.generator.local.backend
    with torch.no_grad():
        logits = backend.model(input_ids=torch.tensor([prompt + completion])).logits
    logits = logits[0, len(prompt) - 1 : -1, : backend.vocab_size]
    return torch.log_softmax(logits / (temperature or 1.0), dim=-1)


def test_top_logprobs_are_the_sampling_distributions_best(server) -> None:
    with server.client() as http:
        episode = http.post("/api/v1/episodes", json={"task_id": "t"}).json()
    llm = openai.OpenAI(base_url=episode["base_url"], api_key=episode["api_key"], max_retries=0)
    decode = server.core.generator.text.decode
    argmax_positions = sampled_elsewhere = 0
    for temperature, n in ((1.5, 3), (0.0, 1)):
        answer = llm.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=20, seed=11, n=n,
                                             temperature=temperature, logprobs=True, top_logprobs=2)
        prompt = answer.model_extra["prompt_token_ids"]
        for choice in answer.choices:
            ids = choice.model_extra["token_ids"]
            entries = choice.logprobs.content
            assert len(entries) == len(ids) > 0
            logp = _distribution(server, prompt, ids, temperature)
            best = logp.topk(2, dim=-1)
            for pos, (token, entry) in enumerate(zip(ids, entries)):
                alternatives = entry.top_logprobs
                assert len(alternatives) == 2
                # The chosen token's log-prob is the one the sampling distribution gives it ...
                assert entry.logprob == pytest.approx(float(logp[pos, token]), abs=TOLERANCE)
                # ... and the alternatives are that distribution's two best, most likely first.
                assert [a.logprob for a in alternatives] == pytest.approx(best.values[pos].tolist(), abs=TOLERANCE)
                assert alternatives[0].logprob >= max(alternatives[1].logprob, entry.logprob)
                if float(best.values[pos, 0] - best.values[pos, 1]) > TOLERANCE:  # no near tie to reorder
                    assert [a.token for a in alternatives] == [decode([int(i)]) for i in best.indices[pos]]
                if token == int(best.indices[pos, 0]):
                    argmax_positions += 1
                    # Chosen = argmax: it is the first alternative, with the identical log-prob.
                    assert alternatives[0].logprob == entry.logprob
                    assert all(a.logprob <= entry.logprob for a in alternatives)
                else:
                    sampled_elsewhere += 1
                    assert alternatives[0].logprob > entry.logprob
    assert argmax_positions > 0 and sampled_elsewhere > 0  # both cases were exercised

    # Asking for none returns none (and the engine skips the work); more than 20 is refused.
    plain = llm.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, seed=1, logprobs=True)
    assert all(entry.top_logprobs == [] for entry in plain.choices[0].logprobs.content)
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):  # a 400 naming the field, as every /v1 refusal
        llm.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, logprobs=True, top_logprobs=21)
