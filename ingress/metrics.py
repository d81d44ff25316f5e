"""The ingress' Prometheus metrics (served on ``/metrics``)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

STEPS = Counter(
    "titoflow_ingress_steps_total",
    "Steps recorded (published and acknowledged), by API and prefix source (tito or rendered).",
    ["api", "prefix"],
)
TOOL_PARSE_ERRORS = Counter(
    "titoflow_ingress_tool_parse_errors_total",
    "Turns whose tool-call text did not parse and was returned as plain text.",
    ["api"],
)
TOKENS = Counter(
    "titoflow_ingress_tokens_total",
    "Tokens sent to (prompt) and received from (completion) the engine.",
    ["direction"],
)
TURN_SECONDS = Histogram(
    "titoflow_ingress_turn_seconds",
    "Whole turn, render to durable step, by API.",
    ["api"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
