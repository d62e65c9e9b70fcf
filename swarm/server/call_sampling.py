"""What a chat call samples with, where the client and the server's config could both decide.

**Completion length.** A call's ``max_tokens`` (or ``max_completion_tokens``); else the config's
``max_tokens``; else the rest of the model's context (its length minus the prompt's), as OpenAI and
vLLM answer a call that sets none. Agent frameworks often send none (strands-agents): a short server
default ends every reply with ``length``, which they raise as an error.

**Whose temperature and top_p** (``client_sampling``). A training episode's samples should come from
the training distribution, the config's ``temperature``/``top_p``: a framework that sends
``temperature: 0.1`` (llama-index's ``OpenAILike``) makes a GRPO group's members near-identical, so
their rewards tie and the group's advantages vanish. ``pin`` holds a training call at the config's
values whatever it sends. ``honor`` (the default) samples as the call asks, as OpenAI and vLLM do:
a client that sets these does so on purpose (greedy turns of a tool loop, a study whose client is the
experiment's temperature knob), and a changed default would silently change every such run. Either
way the deviation is visible: the status' ``client_sampling`` counts training calls that asked for
other values (``honoured``) or had them held (``overridden``), and an episode's trace counts its own
overridden calls (``EpisodeTrace.sampling_overridden``). Eval episodes and control-token calls are
never pinned: they train nothing, and an eval may want greedy decoding.
"""

from __future__ import annotations

from dataclasses import dataclass

from swarm.config import ServerConfig
from swarm.protocol import ChatCompletionRequest, SamplingCounts
from swarm.server.records.episode import EpisodeRecord

__all__ = ["ClientSampling", "completion_budget"]


def completion_budget(requested: int | None, default: int | None, room: int) -> int:
    """Tokens a call may generate: what it asked for, else the config's ``default``, else all ``room``
    left in the context; a default never exceeds the room (a request that does is the caller's 400)."""
    if requested is not None:
        return requested
    return room if default is None else min(default, room)


@dataclass
class ClientSampling:
    """Chooses a call's temperature and top_p under ``client_sampling`` and counts the training calls
    whose own values were honoured or overridden (since the process started; the status reports them)."""

    honoured: int = 0
    overridden: int = 0

    def choose(self, request: ChatCompletionRequest, config: ServerConfig,
               episode: EpisodeRecord | None) -> tuple[float, float]:
        """``(temperature, top_p)`` for a call of ``episode`` (None: a control-token call)."""
        temperature = config.temperature if request.temperature is None else request.temperature
        top_p = config.top_p if request.top_p is None else request.top_p
        if episode is None or episode.is_eval or (temperature, top_p) == (config.temperature, config.top_p):
            return temperature, top_p  # not a training call, or one that asks for the training values
        if config.client_sampling == "pin":
            self.overridden += 1
            episode.trace.sampling_overridden += 1
            return config.temperature, config.top_p
        self.honoured += 1
        return temperature, top_p

    def counts(self) -> SamplingCounts:
        return SamplingCounts(honoured=self.honoured, overridden=self.overridden)
