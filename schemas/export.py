"""The JSON Schema of every event (written to ``docs/schemas`` by ``titoflow docs``)."""

from __future__ import annotations

import json

from schemas.control import CONTROL_EVENTS
from schemas.events import ALL_EVENTS


def render_schemas() -> dict[str, str]:
    """File name → JSON Schema text (serialization side: what is on the wire)."""
    return {
        f"{name}.json": json.dumps(model.model_json_schema(mode="serialization"), indent=2) + "\n"
        for name, model in {**ALL_EVENTS, **{c.__name__: c for c in CONTROL_EVENTS}}.items()
    }
