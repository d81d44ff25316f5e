"""The ingress' uvicorn server, bounded in its shutdown.

Invariant: from the first SIGTERM or SIGINT the process ends within ``shutdown_grace_s``
(:mod:`titoflow.shutdown`): uvicorn drains the turns in flight for the drain share, the app's
lifespan closes its clients within the close share, and a watchdog exits past the grace."""

from __future__ import annotations

import logging
from types import FrameType

import uvicorn

from titoflow.shutdown import arm_hard_exit

log = logging.getLogger("titoflow.ingress")


class BoundedServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, grace_s: float) -> None:
        super().__init__(config)
        self.grace_s = grace_s

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        arm_hard_exit(self.grace_s, log)
        super().handle_exit(sig, frame)
