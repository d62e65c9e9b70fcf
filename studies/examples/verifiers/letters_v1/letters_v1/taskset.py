"""Letters as a verifiers 0.4 taskset: a prompt of 8 random letters, rewarded by the share of 'a' in
the reply (the tiny model is byte-level: a token is a character). Scaffolded by ``vf-init`` and
written against verifiers only: nothing here knows about swarm."""

import random
import string

import verifiers.v1 as vf

COMPLETION_TOKENS = 16  # run with --sampling.max-tokens 16


class LettersData(vf.TaskData):
    """One prompt of 8 random lowercase letters."""


class LettersTask(vf.Task[LettersData]):
    @vf.reward(weight=1.0)
    async def reward(self, trace: vf.Trace) -> float:
        return trace.last_reply.count("a") / COMPLETION_TOKENS


class LettersConfig(vf.TasksetConfig):
    num_tasks: int = 4
    """How many prompts."""
    seed: int = 0
    """Which prompts."""


class LettersTaskset(vf.Taskset[LettersTask, LettersConfig]):
    def load(self) -> list[LettersTask]:
        rng = random.Random(self.config.seed)
        prompts = ["".join(rng.choice(string.ascii_lowercase) for _ in range(8)) for _ in range(self.config.num_tasks)]
        return [LettersTask(LettersData(prompt=prompt), self.config.task) for prompt in prompts]
