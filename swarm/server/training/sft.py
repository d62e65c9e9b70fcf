"""Supervised warm-up samples: a chat prompt rendered by the server, then the target completion.

Studies whose task a random model never solves (digit reversal, tool syntax) ship a few supervised
steps. Each example becomes one ``TrainSample``: the rendered prompt (mask 0) followed by the
completion's tokens and the end-of-turn token (mask 1), exactly what generation would have produced.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import partial

from swarm.backends.base import Generator, TrainConfig, Trainer, TrainSample
from swarm.protocol import SftExample, SftRequest
from swarm.server.training.trainer_thread import TrainerCalls
from swarm.text.templates import prepare_messages


def sft_samples(generator: Generator, examples: Sequence[SftExample]) -> list[TrainSample]:
    """The generator renders (it owns the chat template), so targets match what sampling sees."""
    samples = []
    for example in examples:
        messages = prepare_messages([m.model_dump(exclude_none=True) for m in example.messages])
        prompt = generator.text.render(messages, example.tools)
        completion = [*generator.text.encode(example.completion), generator.eos_token_id]
        samples.append(TrainSample(
            tokens=prompt + completion,
            loss_mask=[0] * len(prompt) + [1] * len(completion),
            rollout_logprobs=[0.0] * (len(prompt) + len(completion)),
            advantage=0.0,
        ))
    return samples


def minibatches(samples: Sequence[TrainSample], batch_size: int, steps: int) -> Iterator[list[TrainSample]]:
    """``steps`` batches of ``batch_size`` samples, cycling through the examples in order."""
    position = 0
    for _ in range(steps):
        batch = [samples[(position + i) % len(samples)] for i in range(min(batch_size, len(samples)))]
        position = (position + len(batch)) % len(samples)
        yield batch


async def run_sft(generator: Generator, trainer: Trainer, calls: TrainerCalls, config: TrainConfig,
                  request: SftRequest, max_context: int) -> list[float]:
    """Run the request's supervised steps through ``calls``; returns each step's loss.
    Raises ``ValueError`` for examples that cannot be trained (nothing is updated then)."""
    samples = sft_samples(generator, request.examples)
    longest = max(len(s.tokens) for s in samples)
    if longest > max_context:
        raise ValueError(f"an example renders to {longest} tokens, over the model's context of {max_context}")
    if request.lr is not None:
        config = config.model_copy(update={"lr": request.lr})
    losses: list[float] = []
    for batch in minibatches(samples, request.batch_size, request.steps):
        update = await calls.call(partial(trainer.supervised_step, batch, config))
        losses.append(float(update["sft/loss"]))
    return losses
