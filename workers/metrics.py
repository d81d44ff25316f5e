"""The worker's Prometheus metrics, served on ``worker_metrics_port`` when it is set."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from schemas.events import DIVERGENCE_CLASSES

SEGMENTS = Counter(
    "titoflow_worker_segments_total", "Segments published, by finalize reason.", ["reason"]
)
DIVERGENCES = Counter(
    "titoflow_worker_divergences_total",
    "Rendered steps that did not extend their segment's tokens, by class; cache_miss counts "
    "the ones that did.",
    ["kind"],
)
for _kind in DIVERGENCE_CLASSES:  # zero from the start: "none yet" is not "not exported"
    DIVERGENCES.labels(_kind)
DEAD_LETTERS = Counter(
    "titoflow_worker_dead_letters_total",
    "Events sent to the DLQ, by reason (schemas/reasons.py DeadLetterReason).",
    ["reason"],
)
CONSUMER_LAG = Gauge(
    "titoflow_worker_consumer_lag",
    "Events of the steps topic not yet consumed, by partition (high watermark - position).",
    ["partition"],
)
PARTIAL_SESSIONS = Counter(
    "titoflow_worker_partial_sessions_total",
    "Sessions met without their start (first steps below where reading began, or deleted unread "
    "by retention): their events were dead-lettered as partial_session, no segment made of them.",
)
REREADS = Counter(
    "titoflow_worker_rereads_total",
    "Times a worker sent its consumer back to where its reading of a partition stood (records "
    "fetched before the partition's latest assignment, handed over after it).",
)
OPEN_SESSIONS = Gauge("titoflow_worker_open_sessions", "Sessions assembled in memory.")
PUBLISH_SECONDS = Histogram(
    "titoflow_worker_publish_seconds",
    "From sending a segment to the broker's acknowledgement.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
DISCARDED = Counter(
    "titoflow_worker_sessions_discarded_total",
    "Sessions that yielded no segment, by reason (discarded, empty).",
    ["reason"],
)
RECOMPUTE_REQUESTED = Counter(
    "titoflow_worker_recompute_requested_total",
    "Segments sent to the recompute stage (tokens whose logprobs it must fill in).",
)

# --- the recompute stage (its own process and /metrics) -------------------------------------------
RECOMPUTE_QUEUE = Gauge(
    "titoflow_recompute_queue",
    "Segments waiting for the recompute stage: unread on <prefix>.recompute plus in flight.",
)
RECOMPUTE_SECONDS = Histogram(
    "titoflow_recompute_seconds",
    "One segment's prompt-logprob call to the engine.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
RECOMPUTE_TOKENS = Counter(
    "titoflow_recompute_tokens_total",
    "Tokens the recompute stage handled: recomputed, or masked_disabled (kill switch), "
    "masked_refused (engine refusal), masked_processed (processed logprobs at T != 1 or cut).",
    ["outcome"],
)
VERSION_MASKED_TOKENS = Counter(
    "titoflow_worker_version_masked_tokens_total",
    "With partial rollout off: generated tokens given loss mask 0 because weights other than "
    "those that sampled their session's first tokens sampled them (steps an ingress replica "
    "could not refuse: the session had moved to it, or began before any version was set).",
)
