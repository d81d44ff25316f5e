"""The dead-letter queue: a record no service could use, sent on with why.

Invariant: a dead letter carries the record's bytes as they were read (base64), where it was
read (topic, partition, offset) and its key, so an operator can replay or inspect it whatever
its content; it is keyed as the record was.
"""

from __future__ import annotations

import base64
import time

from schemas.events import DeadLetter
from schemas.reasons import DeadLetterReason
from titoflow.bus.consumer import ConsumerRecord
from titoflow.bus.producer import RecordPublisher
from titoflow.settings import Settings


async def send_to_dlq(
    publisher: RecordPublisher,
    settings: Settings,
    record: ConsumerRecord,
    reason: DeadLetterReason,
    detail: str = "",
) -> None:
    """Publish ``record`` to ``<prefix>.dlq``: its bytes, where it came from, and why."""
    letter = DeadLetter(
        reason=reason,
        detail=detail,
        source_topic=record.topic,
        source_partition=record.partition,
        source_offset=record.offset,
        key=record.key.decode("utf-8", "replace") if record.key else None,
        value_b64=base64.b64encode(record.value or b"").decode("ascii"),
        event_time=time.time(),
    )
    await publisher.publish(
        settings.topic("dlq"), letter.key or "", letter.model_dump_json().encode()
    )
