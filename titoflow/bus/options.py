"""The client settings every titoflow producer and consumer shares.

Every client built in this package is tuned for what was measured against tansu and holds for
Kafka too: no idempotent producer and no transactions (tansu rejects InitProducerId), short
group session timeouts (joins take about half the session timeout), and bounded waits
everywhere, because the ingress must answer a scaffold (200 or a retryable 503) within
``publish_timeout_s``.
"""

from __future__ import annotations

from typing import Any

from titoflow.settings import Settings

HEALTH_TIMEOUT_S = 1.5
# tansu holds every fetch for the full max wait even when records are there (Kafka answers as
# soon as fetch_min_bytes are in), so aiokafka's 500 ms default puts half a second on every hop
# (docs/benchmarks.md). An idle consumer then polls 50 times a second, which costs the broker
# next to nothing.
FETCH_MAX_WAIT_MS = 20
SESSION_TIMEOUT_MS = 6000
HEARTBEAT_INTERVAL_MS = 1000
# No linger: aiokafka keeps one produce request in flight per broker and packs everything that
# arrives meanwhile into the next one, so bursts batch by themselves, while any linger is added
# in full to every isolated publish. asyncio sets TCP_NODELAY on its sockets, so no Nagle delay
# either.
LINGER_MS = 0
# One batch per partition is in flight at a time, and a record larger than the batch size gets a
# batch to itself: with aiokafka's 16 KiB default, concurrent 20 KB steps need one round trip
# each. 1 MiB is Kafka's default message.max.bytes.
MAX_BATCH_BYTES = 1024 * 1024


def producer_request_timeout_ms(publish_timeout_s: float) -> int:
    """aiokafka's request timeout for a publish budget of ``publish_timeout_s``.

    aiokafka fails a batch only once it is older than ``request_timeout_ms`` *and* an attempt
    failed, and one attempt against a hung broker can cost a connect, an ApiVersions exchange
    and the produce request, each bounded by ``request_timeout_ms``; a metadata refresh between
    attempts can cost one more (against a stopped tansu: docs/benchmarks.md §9). A quarter of the
    budget keeps even three of them plus retry backoffs inside it, so aiokafka has given up (and
    will not retry) before the caller's outer timeout answers 503.
    """
    return max(1, int(publish_timeout_s * 1000 / 4))


def consumer_options(settings: Settings) -> dict[str, Any]:
    """The consumer settings proven against tansu, for aiokafka and FastStream subscribers alike.

    Offsets are committed explicitly (a worker commits only below its oldest open session), and
    a group without committed offsets starts from the beginning of the log.
    """
    return {
        "session_timeout_ms": SESSION_TIMEOUT_MS,
        "heartbeat_interval_ms": HEARTBEAT_INTERVAL_MS,
        "fetch_max_wait_ms": FETCH_MAX_WAIT_MS,
        "auto_offset_reset": "earliest",
        "max_partition_fetch_bytes": settings.max_event_bytes,
        "fetch_max_bytes": max(settings.max_event_bytes, 50 * 1024 * 1024),
    }
