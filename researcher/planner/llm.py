"""The LLM planner: any OpenAI-compatible endpoint through the ``openai`` SDK.

Each step renders its prompt from ``prompts/<step>.md`` and asks for a validated answer model:
first with structured outputs (``response_format`` with the answer's JSON schema); when the server
refuses it (400/422) or ignores it (an answer that breaks the schema), it falls back to the JSON
schema in the prompt plus pydantic validation, with one repair round that shows the model its exact
validation error. The fallback is remembered for the rest of the study (the composition root starts a
later session in JSON mode when the study's call records show it), so a refusing endpoint costs one
refused call, not one a step. Every request is bounded by the study's deadline
(``researcher.planner.deadline``: the timeout cut to the time left, retries only while one fits);
only transient errors (connection, timeouts, 429, 5xx) are retried. A step that gets no valid answer
raises ``PlannerError`` carrying what its answered calls cost (``FallbackPlanner`` then lets the
offline planner take the step); an exhausted quota raises ``QuotaExhausted`` (the study parks).

Every request is reported as one record to ``on_call`` (the composition root writes it as JSON under
``llm_calls/``) and to every listener added with ``add_listener`` (the study context adds
``researcher.tracking.llm_traces``, which makes it an MLflow trace); its tokens and cost are returned
with the answer.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

import openai

# The SDK's own schema converter (what ``chat.completions.parse`` sends, strict where OpenAI needs it).
# Not ``parse`` itself: it raises on an answer that breaks the schema before its tokens can be counted.
from openai.lib._parsing._completions import type_to_response_format_param
from pydantic import BaseModel

from researcher.findings.records import JsonObject
from researcher.planner.deadline import LLMDeadline, backoff, call_within, within_seconds
from researcher.planner.prompts import PromptLibrary
from researcher.planner.schema import (
    ClientCode,
    Decision,
    PlannerContext,
    PlannerError,
    ProposedChanges,
    QuotaExhausted,
    Reply,
    ReportText,
)
from researcher.types.design import Framing, Plan
from researcher.types.failures import is_quota_error, is_transient
from researcher.types.settings import LLMSettings
from researcher.types.usage import LLMCall, LLMUsage, add_usage, new_usage

log = logging.getLogger(__name__)
__all__ = ["LLMPlanner", "is_transient"]
T = TypeVar("T", bound=BaseModel)

_SYSTEM = ("You are the planner of an autonomous RL research agent. Answer with exactly what is asked, "
           "as JSON matching the given schema, and nothing else.")
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)
RETRY_AFTER_MAX_S = 60.0  # a server's Retry-After is honoured up to this (and only where it fits the deadline)
_SOCKET_GRACE_S = 1.0


class LLMPlanner:
    name = "llm"

    def __init__(self, settings: LLMSettings, prompts: PromptLibrary,
                 on_call: Callable[[LLMCall], None] | None = None, deadline: LLMDeadline | None = None,
                 structured: bool = True) -> None:
        """``structured=False``: the JSON schema in the prompt from the start (an earlier session of the
        study found that the endpoint refuses or ignores structured outputs)."""
        self.settings = settings
        self.prompts = prompts
        self.on_call = on_call or (lambda record: None)
        self.deadline = deadline or LLMDeadline()
        self._listeners: list[Callable[[LLMCall], None]] = []
        # Retries are ``call_within``'s, within the deadline; the SDK's would not know it.
        self._client = openai.OpenAI(base_url=settings.base_url, api_key=settings.api_key,
                                     timeout=settings.timeout_s, max_retries=0)
        self._structured = structured  # switched off after the server refuses or ignores json_schema once

    def add_listener(self, listener: Callable[[LLMCall], None]) -> None:
        """Also report every call record to ``listener`` (after ``on_call``); it must not raise."""
        self._listeners.append(listener)

    # ------------------------------------------------------------------ steps

    def frame(self, topic: str, catalog: str) -> Reply[Framing]:
        return self._ask("frame_topic", Framing, topic=topic, catalog=catalog)

    def plan(self, framing: Framing, context: PlannerContext) -> Reply[Plan]:
        return self._ask("plan_experiments", Plan, framing=framing.model_dump_json(indent=2),
                         context=json.dumps(context, indent=2, default=str))

    def write_client(self, framing: Framing, example_source: str, experiments: list[JsonObject],
                     context: PlannerContext | None = None) -> Reply[ClientCode]:
        return self._ask("write_client", ClientCode, framing=framing.model_dump_json(indent=2),
                         example=example_source, experiments=json.dumps(experiments, indent=2, default=str),
                         context=json.dumps(context or {}, indent=2, default=str))

    def repair_client(self, code: str, error: str, example_source: str,
                      context: PlannerContext | None = None) -> Reply[ClientCode]:
        return self._ask("repair_client", ClientCode, code=code, error=error[-6000:], example=example_source,
                         context=json.dumps(context or {}, indent=2, default=str))

    def decide(self, framing: Framing, context: PlannerContext) -> Reply[Decision]:
        return self._ask("decide", Decision, framing=framing.model_dump_json(indent=2),
                         context=json.dumps(context, indent=2, default=str))

    def report(self, framing: Framing, context: PlannerContext) -> Reply[ReportText]:
        return self._ask("write_report", ReportText, framing=framing.model_dump_json(indent=2),
                         context=json.dumps(context, indent=2, default=str))

    def propose(self, goal: str, context: JsonObject, config_keys: str) -> Reply[ProposedChanges]:
        """A discovery campaign's hypotheses beyond the catalog for its next round."""
        return self._ask("propose_hypotheses", ProposedChanges, goal=goal,
                         context=json.dumps(context, indent=2, default=str), config_keys=config_keys)

    # ------------------------------------------------------------------ calls

    def _ask(self, step: str, model: type[T], **values: str) -> Reply[T]:
        prompt = self.prompts.render(step, **values)
        spent: list[LLMUsage] = []  # every answered call of the step: counted whatever happens next
        try:
            value = self._answer(step, prompt, model, spent)
        except QuotaExhausted:
            raise
        except PlannerError as exc:
            exc.usage = _total(spent)
            raise
        except (openai.APIError, TimeoutError) as exc:
            raise PlannerError(f"the LLM endpoint failed {step}: {type(exc).__name__}: {exc}", _total(spent)) from exc
        return Reply(value, _total(spent))

    def _answer(self, step: str, prompt: str, model: type[T], spent: list[LLMUsage]) -> T:
        if self._structured:
            messages = [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": prompt}]
            try:
                return _validate(model, self._request(step, messages, "structured", spent,
                                                      response_format=type_to_response_format_param(model)))
            except (openai.BadRequestError, openai.UnprocessableEntityError) as exc:
                why = f"the endpoint refuses response_format ({exc.status_code})"
            except ValueError as exc:  # pydantic's ValidationError and json's JSONDecodeError are ValueErrors
                why = f"the answer broke the schema ({type(exc).__name__})"
            log.info("structured outputs off for this session: %s; the JSON schema goes in the prompt from %s on",
                     why, step)
            self._structured = False
        messages = [{"role": "system", "content": _SYSTEM},
                    {"role": "user", "content": prompt + "\n\nAnswer with one JSON object matching this JSON "
                     "schema (no prose, no code fences):\n" + json.dumps(model.model_json_schema())}]
        text = self._request(step, messages, "json", spent)
        try:
            return _validate(model, text)
        except ValueError as exc:
            # One repair round: show the model exactly what was wrong with its answer.
            messages += [{"role": "assistant", "content": text},
                         {"role": "user", "content": f"That answer is invalid: {str(exc)[:2000]}\n"
                          "Reply again with only the corrected JSON object."}]
        text = self._request(f"{step}:repair", messages, "json", spent)
        try:
            return _validate(model, text)
        except ValueError as again:
            raise PlannerError(f"the LLM gave no valid {model.__name__} for {step} after a repair round: "
                               f"{str(again)[:500]}") from None

    def _request(self, step: str, messages: list[dict[str, str]], mode: str, spent: list[LLMUsage],
                 **extra: Any) -> str:
        """One chat completion's text, within the deadline of ``step`` (its name before any ``:repair``)."""
        base = step.split(":")[0]

        def attempt(limit: float) -> str:
            started = time.monotonic()
            # The cut at ``limit`` decides; the socket timeouts, a little later, only end an abandoned request.
            client = self._client.with_options(timeout=limit + _SOCKET_GRACE_S)
            why = " (the time left before the study's deadline)" if limit < self.settings.timeout_s else ""
            try:
                completion = within_seconds(limit, lambda: client.chat.completions.create(
                    model=self.settings.model, messages=messages, **extra), why)
            except (openai.APIError, TimeoutError) as exc:
                self._trace(step, messages, None, new_usage(), started, error=f"{type(exc).__name__}: {exc}",
                            mode=mode)
                if is_quota_error(exc):
                    raise QuotaExhausted(f"the LLM provider is out of quota or credit ({step}): {exc}") from exc
                raise
            text = completion.choices[0].message.content or ""
            used = self._usage(completion)
            spent.append(used)
            self._trace(step, messages, text, used, started, mode=mode)
            return text

        return call_within(attempt, left=lambda: self.deadline.left(base), timeout_s=self.settings.timeout_s,
                           max_retries=self.settings.max_retries, wait=_retry_wait)

    def _usage(self, completion: Any) -> LLMUsage:
        usage = getattr(completion, "usage", None)
        prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
        out = int(getattr(usage, "completion_tokens", 0) or 0)
        cost_in, cost_out = self._costs(prompt, out)
        return {"calls": 1, "prompt_tokens": prompt, "completion_tokens": out, "cost_usd": cost_in + cost_out}

    def _costs(self, prompt_tokens: int, completion_tokens: int) -> tuple[float, float]:
        """Dollars for the prompt and for the completion, at the configured prices."""
        return (prompt_tokens * self.settings.price_in_per_mtok / 1e6,
                completion_tokens * self.settings.price_out_per_mtok / 1e6)

    def _trace(self, step: str, messages: list[dict[str, str]], answer: str | None, usage: LLMUsage,
               started: float, *, mode: str, error: str | None = None) -> None:
        cost_in, cost_out = self._costs(usage["prompt_tokens"], usage["completion_tokens"])
        record: LLMCall = {"step": step, "mode": mode, "model": self.settings.model, "messages": messages,
                  "answer": answer, "error": error, "usage": usage,
                  "cost": {"input_usd": cost_in, "output_usd": cost_out},
                  "seconds": round(time.monotonic() - started, 3), "time": time.time()}
        self.on_call(record)
        for listener in self._listeners:
            listener(record)


def _retry_wait(exc: Exception, failures: int) -> float | None:
    """How long to wait before retrying a failed request: the server's Retry-After (up to a minute), else
    the backoff; None for what a retry cannot fix (a 4xx the request caused, an exhausted quota)."""
    if not (isinstance(exc, TimeoutError) or is_transient(exc)):
        return None
    response = getattr(exc, "response", None)
    try:
        asked = float(response.headers.get("retry-after", "")) if response is not None else 0.0
    except ValueError:
        asked = 0.0
    return asked if 0 < asked <= RETRY_AFTER_MAX_S else backoff(failures)


def _total(spent: list[LLMUsage]) -> LLMUsage:
    total = new_usage()
    for used in spent:
        total = add_usage(total, used)
    return total


def _validate(model: type[T], text: str) -> T:
    stripped = text.strip()
    fenced = _FENCE.match(stripped)
    if fenced:
        stripped = fenced.group(1)
    return model.model_validate_json(stripped)
