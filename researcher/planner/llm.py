"""The LLM planner: any OpenAI-compatible endpoint through the ``openai`` SDK.

Each step renders its prompt from ``prompts/<step>.md`` and asks for a validated answer model:
first with structured outputs (``chat.completions.parse``); when the server rejects (400/422) or
ignores the schema, it falls back to the JSON schema in the prompt plus pydantic validation, with
one repair round that shows the model its validation error. Only transient errors (connection,
timeouts, 429, 5xx) are retried, by the SDK's own backoff. Every call is reported as one record to
``on_call`` (the composition root writes it as JSON under ``llm_calls/``) and to every listener added
with ``add_listener`` (the study context adds ``researcher.tracking.llm_traces``, which makes it an MLflow
trace); its tokens and cost are returned with the answer.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

import openai
from pydantic import BaseModel, ValidationError

from researcher.findings.records import JsonObject
from researcher.planner.prompts import PromptLibrary
from researcher.planner.schema import (
    ClientCode,
    Decision,
    Framing,
    Plan,
    PlannerContext,
    PlannerError,
    QuotaExhausted,
    Reply,
    ReportText,
)
from researcher.planner.usage import LLMCall, LLMUsage, add_usage, new_usage
from researcher.settings import LLMSettings
from researcher.watchdogs import is_quota_error, is_transient

log = logging.getLogger(__name__)
__all__ = ["LLMPlanner", "is_transient"]
T = TypeVar("T", bound=BaseModel)

_SYSTEM = ("You are the planner of an autonomous RL research agent. Answer with exactly what is asked, "
           "as JSON matching the given schema, and nothing else.")
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


class LLMPlanner:
    name = "llm"

    def __init__(self, settings: LLMSettings, prompts: PromptLibrary,
                 on_call: Callable[[LLMCall], None] | None = None) -> None:
        self.settings = settings
        self.prompts = prompts
        self.on_call = on_call or (lambda record: None)
        self._listeners: list[Callable[[LLMCall], None]] = []
        self._client = openai.OpenAI(base_url=settings.base_url, api_key=settings.api_key,
                                     timeout=settings.timeout_s, max_retries=settings.max_retries)
        self._structured = True  # switched off after the server rejects or ignores json_schema once

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

    # ------------------------------------------------------------------ calls

    def _ask(self, step: str, model: type[T], **values: str) -> Reply[T]:
        prompt = self.prompts.render(step, **values)
        usage = new_usage()
        if self._structured:
            try:
                value, used = self._parse(step, prompt, model)
                return Reply(value, add_usage(usage, used))
            except (openai.BadRequestError, openai.UnprocessableEntityError, openai.LengthFinishReasonError,
                    ValidationError, json.JSONDecodeError, TypeError) as exc:
                log.info("structured outputs failed for %s (%s); falling back to JSON in the prompt",
                         step, type(exc).__name__)
                self._structured = False
        messages = [{"role": "system", "content": _SYSTEM},
                    {"role": "user", "content": prompt + "\n\nAnswer with one JSON object matching this JSON "
                     "schema (no prose, no code fences):\n" + json.dumps(model.model_json_schema())}]
        text, used = self._create(step, messages)
        usage = add_usage(usage, used)
        try:
            return Reply(_validate(model, text), usage)
        except (ValidationError, ValueError) as exc:
            # One repair round: show the model exactly what was wrong with its answer.
            messages += [{"role": "assistant", "content": text},
                         {"role": "user", "content": f"That answer is invalid: {str(exc)[:2000]}\n"
                          "Reply again with only the corrected JSON object."}]
            text, used = self._create(f"{step}:repair", messages)
            usage = add_usage(usage, used)
            try:
                return Reply(_validate(model, text), usage)
            except (ValidationError, ValueError) as again:
                raise PlannerError(f"the LLM gave no valid {model.__name__} for {step} after a repair round: "
                                   f"{str(again)[:500]}") from None

    def _parse(self, step: str, prompt: str, model: type[T]) -> tuple[T, LLMUsage]:
        messages = [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": prompt}]
        started = time.monotonic()
        try:
            completion = self._client.chat.completions.parse(model=self.settings.model, messages=messages,
                                                             response_format=model)
        except openai.APIError as exc:
            self._trace(step, messages, None, new_usage(), started, error=str(exc), mode="structured")
            if is_quota_error(exc):
                raise QuotaExhausted(f"the LLM provider is out of quota or credit ({step}): {exc}") from exc
            raise
        message = completion.choices[0].message
        used = self._usage(completion)
        self._trace(step, messages, message.content, used, started, mode="structured")
        if message.parsed is None:
            raise json.JSONDecodeError("no parsed answer", message.content or "", 0)
        return message.parsed, used

    def _create(self, step: str, messages: list[dict[str, str]]) -> tuple[str, LLMUsage]:
        started = time.monotonic()
        try:
            completion = self._client.chat.completions.create(model=self.settings.model, messages=messages)
        except openai.APIError as exc:
            self._trace(step, messages, None, new_usage(), started, error=str(exc), mode="json")
            if is_quota_error(exc):
                raise QuotaExhausted(f"the LLM provider is out of quota or credit ({step}): {exc}") from exc
            if is_transient(exc):
                raise  # the graph's retry policy may try the node again later
            raise PlannerError(f"the LLM endpoint refused {step}: {exc}") from exc
        text = completion.choices[0].message.content or ""
        used = self._usage(completion)
        self._trace(step, messages, text, used, started, mode="json")
        return text, used

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


def _validate(model: type[T], text: str) -> T:
    stripped = text.strip()
    fenced = _FENCE.match(stripped)
    if fenced:
        stripped = fenced.group(1)
    return model.model_validate_json(stripped)
