"""The ingress' Prometheus metrics (served on ``/metrics``)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import get_args

from prometheus_client import Counter, Gauge, Histogram

from ingress.turns.turn import Api

STEPS = Counter(
    "titoflow_ingress_steps_total",
    "Steps recorded (published and acknowledged), by API and prefix: tito is a TITO cache hit, "
    "rendered a miss (first turn of a chain, or another replica's session).",
    ["api", "prefix"],
)
TOOL_PARSE_ERRORS = Counter(
    "titoflow_ingress_tool_parse_errors_total",
    "Turns whose tool-call text did not parse and was returned as plain text.",
    ["api"],
)
# Zero from the start, so a dashboard tells "no parse error yet" from "not exported".
for _api in get_args(Api):
    TOOL_PARSE_ERRORS.labels(_api)
TOKENS = Counter(
    "titoflow_ingress_tokens_total",
    "Tokens sent to (prompt) and received from (completion) the engine.",
    ["direction"],
)
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
TURN_SECONDS = Histogram(
    "titoflow_ingress_turn_seconds",
    "Whole turn, render to durable step, by API.",
    ["api"],
    buckets=_LATENCY_BUCKETS,
)
OVERHEAD_SECONDS = Histogram(
    "titoflow_ingress_overhead_seconds",
    "What the ingress adds to a turn (render, parse, publish): turn time minus engine time.",
    ["api"],
    buckets=_LATENCY_BUCKETS,
)
PROMPT_TOKENS = TOKENS.labels("prompt")
COMPLETION_TOKENS = TOKENS.labels("completion")


@dataclass(frozen=True)
class StepMetrics:
    """The children a step of one API and prefix counts into."""

    steps: Counter
    tool_parse_errors: Counter
    turn_seconds: Histogram
    overhead_seconds: Histogram


@cache  # a handful of (API, prefix) pairs; labels() costs a lock and a look-up each call
def step_metrics(api: str, prefix: str) -> StepMetrics:
    return StepMetrics(
        STEPS.labels(api, prefix),
        TOOL_PARSE_ERRORS.labels(api),
        TURN_SECONDS.labels(api),
        OVERHEAD_SECONDS.labels(api),
    )


PUBLISH_SECONDS = Histogram(
    "titoflow_ingress_publish_seconds",
    "From sending an event to the broker's acknowledgement.",
    buckets=_LATENCY_BUCKETS,
)
PUBLISH_FAILURES = Counter(
    "titoflow_ingress_publish_failures_total",
    "Events the broker did not acknowledge (the client got a retryable error).",
)
PAUSED = Gauge(
    "titoflow_ingress_paused",
    "1 while the control log says generation is paused (new requests are held), else 0.",
)
HELD = Gauge(
    "titoflow_ingress_held_requests",
    "Requests waiting for a resume: new ones held at admission and abort-ended ones waiting "
    "to continue.",
)
CONTINUED_AFTER_ABORT = Counter(
    "titoflow_ingress_continued_after_abort_total",
    "Generations ended by an abort-mode pause and continued after the resume (one response).",
)
ENGINE_CONTROL_FAILURES = Counter(
    "titoflow_ingress_engine_control_failures_total",
    "Engine control calls (pause, resume, update_weight_version) that failed and are retried.",
)
NOT_APPEND_ONLY = Counter(
    "titoflow_ingress_not_append_only_total",
    "Turns whose cached chain the chat template could not continue (it re-renders the history "
    "once the new messages follow, e.g. moves a later system message up front): rendered in "
    "full as a new chain, so the worker starts a new segment.",
)
OFF_LOOP_RENDERS = Counter(
    "titoflow_ingress_off_loop_renders_total",
    "Turns whose text to render was large enough to render and tokenize in a worker thread, so "
    "the event loop kept serving other sessions.",
)
EARLY_CONTEXT_REFUSALS = Counter(
    "titoflow_ingress_early_context_refusals_total",
    "Turns refused as too long for the context from a lower bound on their length (characters "
    "over the most a token covers), before their text was tokenized.",
)
REFUSALS = Counter(
    "titoflow_ingress_refusals_total",
    "Requests refused before the status line, by reason: the error code, or overloaded_replica "
    "/ overloaded_engine (generations in flight at their bound), budget_turns / budget_tokens / "
    "budget_wall_s (a session's budget used up).",
    ["reason"],
)
