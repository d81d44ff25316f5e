"""Publishing control commands (``titoflow control`` and the ingress admin endpoint share it)."""

from __future__ import annotations

import time
from typing import Any

from pydantic import ValidationError

from schemas.control import AnyControl, control_adapter
from titoflow.bus import Publisher
from titoflow.settings import Settings


def control_event(command: dict[str, Any], issued_by: str) -> AnyControl:
    """The event a command describes (``{"type": "pause", "mode": "abort"}``...), stamped now.
    Raises ``ValueError`` naming what is wrong."""
    try:
        return control_adapter.validate_python(
            {**command, "event_time": time.time(), "issued_by": issued_by}
        )
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ValueError(f"{where}: {first['msg']}" if where else first["msg"]) from exc


async def publish_control(publisher: Publisher, settings: Settings, event: AnyControl) -> int:
    """Append ``event`` to the control log; its offset once the broker acknowledged it."""
    _, offset = await publisher.publish(
        settings.topic("control"), "control", event.model_dump_json().encode()
    )
    return offset
