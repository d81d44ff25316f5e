"""Structured logs: one JSON object per line, with session and step ids when a record has them.

Pass ids through ``extra={"session_id": ..., "step_id": ...}``; the formatter adds every extra
field it finds, so a log pipeline can filter one session across ingress and workers.
"""

from __future__ import annotations

import json
import logging
from typing import Any

# Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def setup_logging(level: str, log_format: str, libraries: str | None = None) -> None:
    """Log to stderr: titoflow's loggers (``titoflow.*``) at ``level``, every other library's at
    ``libraries`` (None: at ``level`` too)."""
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=libraries or level, handlers=[handler], force=True)
    logging.getLogger("titoflow").setLevel(level)
