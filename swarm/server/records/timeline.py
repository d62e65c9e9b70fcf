"""Token-exact episode traces and timeline merging.

Agents re-send the whole conversation on every call. Training one sample per call repeats the
history quadratically, and re-tokenising generated text corrupts log-probs. A trace therefore keeps
*timelines*: exact token sequences built from the server's own prompt rendering and the ids and
log-probs exactly as sampled. A call whose prompt starts with a timeline's tokens continues that
timeline (new prompt tokens get loss mask 0, the completion mask 1); a call that extends none
(history rewritten, memory summarised, a template that drops earlier reasoning) forks a new
timeline and is counted as drift (``drift_forks``). Replies re-sent as text are first mapped back to
the ids that were sampled for them (``swarm.text.drift``), so re-tokenisation alone never forks;
``drift_repaired`` counts the calls where that made a difference. With ``merge=False`` every completion is its own sample, which
is what merging is measured against.

Tokens sampled under a grammar (constrained decoding: a forced tool call, a JSON ``response_format``)
are marked per call as ``[start, end)`` spans of the timeline (``Timeline.constrained``), so an
analysis can separate them: their recorded log-probs are those of the masked distribution, which the
trainer's rollout importance correction weighs against the unmasked policy.

Under ``token-mean`` loss aggregation both modes train on the same generated tokens with the same
contexts, so they give the same loss; merging only removes the repeated context.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from swarm.backends.base import TrainSample
from swarm.text.parsers import ParsedReply


@dataclass
class Timeline:
    """One exact token sequence with its loss mask and recorded log-probs (shapes all equal)."""

    tokens: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    temperature: float = 1.0
    calls: int = 0
    constrained: list[tuple[int, int]] = field(default_factory=list)  # [start, end) spans sampled under a grammar

    def is_prefix_of(self, prompt: Sequence[int]) -> bool:
        n = len(self.tokens)
        return n <= len(prompt) and list(prompt[:n]) == self.tokens

    def extended(self, prompt: Sequence[int], completion: Sequence[int], logprobs: Sequence[float], version: int,
                 constrained: bool = False) -> Timeline:
        """A new timeline: this one, the prompt's new tokens (mask 0), then the completion (mask 1),
        marked as constrained when it was sampled under a grammar."""
        if len(completion) != len(logprobs):
            raise ValueError("completion and logprobs differ in length")
        context = list(prompt[len(self.tokens):])
        start = len(prompt)
        spans = [*self.constrained, (start, start + len(completion))] if constrained and completion else self.constrained
        return Timeline(
            tokens=self.tokens + context + list(completion),
            loss_mask=self.loss_mask + [0] * len(context) + [1] * len(completion),
            logprobs=self.logprobs + [0.0] * len(context) + [float(x) for x in logprobs],
            versions=[*self.versions, version],
            temperature=self.temperature,
            calls=self.calls + 1,
            constrained=list(spans),
        )

    @property
    def generated_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def constrained_tokens(self) -> int:
        return sum(end - start for start, end in self.constrained)

    def to_sample(self, advantage: float) -> TrainSample:
        return TrainSample(
            tokens=list(self.tokens),
            loss_mask=list(self.loss_mask),
            rollout_logprobs=list(self.logprobs),
            advantage=advantage,
            temperature=self.temperature,
            policy_versions=list(self.versions),
        )


@dataclass
class EpisodeTrace:
    """All completions of one episode, kept as timelines."""

    merge: bool = True
    timelines: list[Timeline] = field(default_factory=list)
    calls: int = 0
    drift_forks: int = 0  # calls that continued no timeline: the history really changed
    # Live counters of the agent protocol (not stored: a restored episode reports 0 for them).
    drift_repaired: int = 0  # calls whose plain re-rendering would differ from the ids the model saw
    tool_calls: int = 0  # tool calls parsed out of replies
    tool_parse_errors: int = 0  # replies that looked like a tool call but did not parse
    tool_calls_extra: int = 0  # calls past the first of parallel_tool_calls=false replies (returned as content)
    sampling_overridden: int = 0  # calls whose temperature/top_p were held at the training values (client_sampling)

    def note_replies(self, replies: Sequence[ParsedReply], *, repaired: bool) -> None:
        """Count one call's agent-protocol outcomes (see the fields)."""
        self.drift_repaired += int(repaired)
        self.tool_calls += sum(len(r.tool_calls) for r in replies)
        self.tool_parse_errors += sum(r.parse_error is not None for r in replies)
        self.tool_calls_extra += sum(r.extra_calls for r in replies)

    def record(
        self,
        prompt: Sequence[int],
        completions: Sequence[tuple[Sequence[int], Sequence[float]]],
        version: int,
        temperature: float,
        constrained: bool = False,
    ) -> None:
        """Add one chat call: its rendered prompt and its ``n`` sampled (ids, log-probs) choices
        (``constrained``: sampled under a grammar)."""
        parent = self._parent_for(prompt, temperature) if self.merge else None
        if self.calls > 0 and self._extends_nothing(prompt, temperature):
            self.drift_forks += 1
        base = parent if parent is not None else Timeline(temperature=temperature)
        grown = [base.extended(prompt, ids, lps, version, constrained) for ids, lps in completions]
        if parent is not None:
            # The first choice continues the parent; further choices are sibling branches.
            self.timelines[self.timelines.index(parent)] = grown[0]
            self.timelines.extend(grown[1:])
        else:
            self.timelines.extend(grown)
        self.calls += 1

    def _parent_for(self, prompt: Sequence[int], temperature: float) -> Timeline | None:
        """The longest timeline this prompt continues at the same temperature, if any."""
        best: Timeline | None = None
        for timeline in self.timelines:
            if timeline.temperature == temperature and timeline.is_prefix_of(prompt):
                if best is None or len(timeline.tokens) > len(best.tokens):
                    best = timeline
        return best

    def _extends_nothing(self, prompt: Sequence[int], temperature: float) -> bool:
        return self._parent_for(prompt, temperature) is None

    def samples(self, advantage: float) -> list[TrainSample]:
        return [t.to_sample(advantage) for t in self.timelines if t.generated_tokens > 0]

    @property
    def tokens(self) -> int:
        return sum(len(t.tokens) for t in self.timelines)

    @property
    def constrained_tokens(self) -> int:
        """Generated tokens sampled under a grammar, over every timeline."""
        return sum(t.constrained_tokens for t in self.timelines)

    @property
    def min_version(self) -> int | None:
        versions = [v for t in self.timelines for v in t.versions]
        return min(versions) if versions else None
