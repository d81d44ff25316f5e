"""What a replay did, and its summary for a person (stderr).

Invariant: every record read is counted once, as applied or filtered out, and every record the
assembler dead-lettered or skipped is counted by reason; only the first ``MAX_LISTED`` of each
are listed one by one, so the summary stays short whatever the log holds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

# Kept for the summary; the counts by reason cover the rest.
MAX_LISTED = 20


@dataclass(frozen=True)
class Noted:
    """One record a replay dead-lettered or skipped (the live worker would have too)."""

    partition: int
    offset: int
    key: str | None
    reason: str  # a DeadLetterReason, or why it was skipped
    detail: str = ""


@dataclass
class ReplayReport:
    topic: str
    ranges: dict[int, tuple[int, int]] = field(default_factory=dict)  # partition: [start, end)
    records: int = 0  # read in those ranges
    events: int = 0  # passed the filters, applied to the assembler
    segments: int = 0
    dead_letters: list[Noted] = field(default_factory=list)
    skipped: list[Noted] = field(default_factory=list)
    open_sessions: list[str] = field(default_factory=list)  # still open at the end
    finalized_open: bool = False
    counters: dict[str, int] = field(default_factory=dict)  # the assembler's
    elapsed_s: float = 0.0

    @property
    def filtered_out(self) -> int:
        return self.records - self.events


def _listed(title: str, noted: Iterable[Noted]) -> list[str]:
    items = list(noted)
    if not items:
        return []
    lines = [f"{title}: {len(items)}"]
    for reason, count in Counter(n.reason for n in items).most_common():
        lines.append(f"  {count:>6}  {reason}")
    for n in items[:MAX_LISTED]:
        detail = f" ({n.detail[:300]})" if n.detail else ""
        lines.append(f"    p{n.partition}@{n.offset} key={n.key!r}: {n.reason}{detail}")
    if len(items) > MAX_LISTED:
        lines.append(f"    ... and {len(items) - MAX_LISTED} more")
    return lines


def format_summary(report: ReplayReport) -> str:
    """What a replay did, for a person (stderr)."""
    ranges = " ".join(f"p{p}:[{s},{e})" for p, (s, e) in report.ranges.items() if e > s)
    lines = [
        f"replayed {report.topic}: {ranges or 'nothing to read'}",
        f"records read: {report.records}, applied: {report.events}, "
        f"filtered out: {report.filtered_out}",
        f"segments: {report.segments} in {report.elapsed_s:.2f}s",
    ]
    lines += _listed("dead letters (the live worker sends these to the DLQ)", report.dead_letters)
    lines += _listed("skipped", report.skipped)
    if report.open_sessions:
        verb = "finalized as idle" if report.finalized_open else "not emitted (--finalize-open)"
        shown = ", ".join(report.open_sessions[:MAX_LISTED])
        more = len(report.open_sessions) - MAX_LISTED
        lines.append(
            f"sessions still open at the end: {len(report.open_sessions)}, {verb}: {shown}"
            + (f" ... and {more} more" if more > 0 else "")
        )
    else:
        lines.append("sessions still open at the end: 0")
    if report.counters:
        counters = ", ".join(f"{k}={v}" for k, v in sorted(report.counters.items()))
        lines.append(f"assembler counters: {counters}")
    return "\n".join(lines)
