"""Samples that nobody continued, told apart from the branches the client followed.

Invariant: of several samples of one prompt, those nobody continued while a sibling was
continued (or, when none was, all but the latest: a client's retries, it kept the last answer)
are emitted on their own, marked ``unused_sample``, with only their own completion trainable;
their ancestors stay trainable once, in a segment of their own (the branch that continued them
holds them as context).
"""

from __future__ import annotations

from schemas.reasons import SplitReason
from workers.assembly.segment import OpenSegment
from workers.assembly.session import Session


def unused_samples(session: Session) -> set[str]:
    """The step ids of the session's unused samples."""
    unused: set[str] = set()
    for samples in session.samples.values():
        if len(samples) < 2:
            continue
        leaves = [s for s in samples if s not in session.continued]
        unused.update(leaves if len(leaves) < len(samples) else leaves[:-1])
    return unused


def split_unused(session: Session) -> tuple[list[OpenSegment], list[OpenSegment]]:
    """The session's segments with a trainable token, split into those the client followed
    and those whose only trainable tokens are an unused sample."""
    unused_steps = unused_samples(session)
    used: list[OpenSegment] = []
    unused: list[OpenSegment] = []
    for segment in session.segments:
        if not segment.steps or not segment.own_trainable(len(segment.tokens)):
            continue
        head = segment.steps[-1]
        if head.step_id not in unused_steps or segment.carried >= head.completion_end:
            used.append(segment)
            continue
        session.diagnostics["unused_samples"] += 1
        if segment.own_trainable(head.prompt_start):
            ancestors = segment.copy(segment.split_reason)
            ancestors.truncate(len(segment.steps) - 1)
            used.append(ancestors)
            segment = segment.copy(SplitReason.FORK)
            segment.make_context(head.prompt_start)
        unused.append(segment)
    return used, unused
