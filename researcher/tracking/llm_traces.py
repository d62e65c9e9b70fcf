"""Planner LLM calls as MLflow traces, each linked to the iteration run it belongs to.

Every call the LLM planner makes (a record from ``LLMPlanner``) becomes one trace holding one
``CHAT_MODEL`` span: the messages sent, the answer, token usage, cost, latency (the span's start and
end), the step, the model and the error if the call failed. The MLflow UI then shows what the
planner was asked and answered on the study's iteration run; the JSON copies in ``llm_calls/`` stay.

Which run: a call belongs to the study's current iteration (``mlflow_parent_run`` in the
checkpointed state), except framing and planning, which are made before the run of the iteration
they lead to exists. Such a trace is tagged ``researcher.run_link=pending`` with its iteration and
linked by the first later call that sees that iteration's run (``link_traces_to_run``); the report
call, the study's last, takes whatever is still pending (an iteration planned but never run). The
tag lives in MLflow, so a crash or a parked session loses no link.

Written with explicit clients on the study's tracking URI and experiment. ``MlflowClient.start_trace``
is not used: it exports through MLflow's process-global tracer to the global tracking URI, which need
not be the study's store (one process may run several studies). Tracing is best effort: any failure
(the store unreachable, a refused write) is logged as a warning and the planner call goes on.
"""

from __future__ import annotations

import base64
import json
import logging
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from researcher.tracking.tracker import Tracker
from researcher.types.usage import LLMCall

log = logging.getLogger(__name__)
__all__ = ["PENDING", "RUN_LINK_TAG", "PlannerTraces"]

RUN_LINK_TAG = "researcher.run_link"  # "pending" until the trace's iteration run exists, then "linked"
PENDING = "pending"
_LEADS_TO_NEXT = frozenset({"frame_topic", "plan_experiments"})  # made before their iteration's run exists
_PREVIEW = 1000
_LINK_BATCH = 100  # MLflow's limit per link_traces_to_run request


class PlannerTraces:
    """Writes planner call records of one study as MLflow traces; ``record`` is the planner listener."""

    def __init__(self, tracker: Tracker, study_id: str, calls_dir: Path,
                 current_state: Callable[[], Mapping[str, Any] | None]) -> None:
        """``current_state`` reads the study's checkpointed state (``study.store.read_state``; the context
        passes it, so tracking knows nothing of the study's files or graph); ``calls_dir`` holds the calls'
        JSON copies, named when a trace cannot be written."""
        self.tracker = tracker
        self.study_id = study_id
        self.calls_dir = calls_dir
        self._current_state = current_state
        self._experiment: str | None = None
        self._writer: Any = None
        self._maybe_pending = True  # unknown after a restart: look once

    def record(self, call: LLMCall) -> str | None:
        """Trace one planner call; the trace id, or None when tracing failed (logged, never raised)."""
        try:
            return self._record(call)
        except Exception as exc:  # best effort by contract: the JSON copy is the fallback
            log.warning("could not write the planner call %s as an MLflow trace (%s: %s); its JSON copy stays "
                        "in %s", call.get("step"), type(exc).__name__, exc, self.calls_dir)
            return None

    def _record(self, call: LLMCall) -> str:
        state = self._current_state() or {}
        current = int(state.get("iteration") or 0)
        run = self.tracker.real_id(state.get("mlflow_parent_run"))
        step = str(call["step"])
        iteration = current + 1 if step.split(":")[0] in _LEADS_TO_NEXT else current
        source_run = run if iteration == current else None
        experiment = self._experiment_id()
        trace_id = self._write(experiment, call, iteration, source_run)
        if source_run is None:
            self._maybe_pending = True
        elif self._maybe_pending:
            self._link_pending(experiment, source_run, current, everything=step.startswith("write_report"))
        return trace_id

    def _experiment_id(self) -> str:
        if self._experiment is None:
            self._experiment = self.tracker.experiment_id(self.study_id)
        return self._experiment

    def _write(self, experiment: str, call: LLMCall, iteration: int, run_id: str | None) -> str:
        from mlflow.entities import Span, TraceInfo, TraceLocation, TraceState
        from mlflow.tracing.client import TracingClient

        if self._writer is None:
            self._writer = TracingClient(self.tracker.uri)
        otel_trace_id = uuid.uuid4().int
        trace_id = f"tr-{otel_trace_id:032x}"
        end_ns = int(float(call["time"]) * 1e9)
        start_ns = end_ns - int(float(call["seconds"]) * 1e9)
        failed = call.get("error") is not None
        tags = {"mlflow.traceName": str(call["step"]), "researcher.study_id": self.study_id,
                "researcher.step": str(call["step"]), "researcher.mode": str(call.get("mode")),
                "researcher.iteration": str(iteration)}
        if run_id is None:
            tags[RUN_LINK_TAG] = PENDING
        span = Span.from_dict({
            "trace_id": _b64(otel_trace_id, 16), "span_id": _b64(uuid.uuid4().int >> 64, 8), "parent_span_id": None,
            "name": str(call["step"]), "start_time_unix_nano": start_ns, "end_time_unix_nano": end_ns, "events": [],
            "status": {"code": "STATUS_CODE_ERROR" if failed else "STATUS_CODE_OK", "message": call.get("error") or ""},
            "attributes": {key: json.dumps(value, default=str) for key, value in _attributes(trace_id, call).items()},
        })
        info = TraceInfo(trace_id=trace_id, trace_location=TraceLocation.from_experiment_id(experiment),
                         request_time=start_ns // 1_000_000, execution_duration=(end_ns - start_ns) // 1_000_000,
                         state=TraceState.ERROR if failed else TraceState.OK,
                         request_preview=_last_user_message(call)[:_PREVIEW],
                         response_preview=str((call["error"] if failed else call.get("answer")) or "")[:_PREVIEW],
                         trace_metadata={"mlflow.sourceRun": run_id} if run_id else {}, tags=tags)
        # The order MLflow's own exporter uses: the spans, then the trace info that finalises them.
        self._writer.log_spans(experiment, [span])
        self._writer.start_trace(info)
        return trace_id

    def _link_pending(self, experiment: str, run_id: str, iteration: int, everything: bool) -> None:
        """Link traces still waiting for ``iteration``'s run (all of them when ``everything``) to ``run_id``."""
        client = self.tracker.client
        found = client.search_traces(locations=[experiment], filter_string=f"tag.`{RUN_LINK_TAG}` = '{PENDING}'",
                                     include_spans=False, max_results=1000)
        due = [t.info.trace_id for t in found
               if everything or t.info.tags.get("researcher.iteration") == str(iteration)]
        for i in range(0, len(due), _LINK_BATCH):
            client.link_traces_to_run(due[i:i + _LINK_BATCH], run_id)
        for trace_id in due:
            client.set_trace_tag(trace_id, RUN_LINK_TAG, "linked")
        self._maybe_pending = len(due) < len(found)
        if due:
            log.info("linked %d earlier planner traces to iteration run %s", len(due), run_id)


def _attributes(trace_id: str, call: LLMCall) -> dict[str, object]:
    """The span's attributes in MLflow's keys, so the UI renders a chat with its tokens and cost."""
    usage = call.get("usage") or {}
    cost = call.get("cost") or {}
    prompt, completion = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    attributes: dict[str, object] = {
        "mlflow.traceRequestId": trace_id,
        "mlflow.spanType": "CHAT_MODEL",
        "mlflow.message.format": "openai",
        "mlflow.llm.model": call.get("model"),
        "mlflow.spanInputs": {"model": call.get("model"), "messages": call.get("messages") or []},
        "mlflow.chat.tokenUsage": {"input_tokens": prompt, "output_tokens": completion,
                                   "total_tokens": prompt + completion},
        "mlflow.llm.cost": {"input_cost": float(cost.get("input_usd", 0.0)),
                            "output_cost": float(cost.get("output_usd", 0.0)),
                            "total_cost": float(usage.get("cost_usd", 0.0))},
        "researcher.step": call.get("step"),
        "researcher.mode": call.get("mode"),
        "researcher.latency_s": call.get("seconds"),
    }
    if call.get("answer") is not None:
        attributes["mlflow.spanOutputs"] = {"choices": [{"index": 0, "finish_reason": "stop",
                                                         "message": {"role": "assistant", "content": call["answer"]}}]}
    if call.get("error") is not None:
        attributes["researcher.error"] = call["error"]
    return attributes


def _last_user_message(call: LLMCall) -> str:
    users = [m.get("content") or "" for m in call.get("messages") or [] if m.get("role") == "user"]
    return str(users[-1]) if users else ""


def _b64(value: int, size: int) -> str:
    return base64.b64encode(value.to_bytes(size, "big")).decode()
