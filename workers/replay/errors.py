"""The error a replay or a scan reports to the person who started it.

Invariant: a failure that person can act on (no such topic or partition, a bad offset or time,
a broker or engine out of reach, a log that changed under the read) is a :class:`ReplayError`
whose message says which, so the CLI answers it in one line, never with a traceback.
"""

from __future__ import annotations


class ReplayError(Exception):
    """The replay cannot start or go on as asked."""
