"""Samples that nobody continued, told apart from the branches the client followed.

Invariants:
- Of several samples of one prompt (a chat request's ``n`` choices, a retried request, parallel
  identical starts), those nobody continued while a sibling was continued are unused; when none
  was continued, all but one are: the one whose step id sorts first (ids are drawn at random,
  so the pick is unbiased, and it depends on the events, not on their order).
- Each unused sample is emitted on its own, marked ``unused_sample`` (``split_reason: fork``),
  with only its own completion trainable; its ancestors stay trainable once.
- Continuing a sibling is not a fork: the sibling the client went on with takes the first
  sample's place in the trajectory, so a session whose client never rewound or edited its
  history is one trajectory segment plus its unused samples, whichever sibling was placed
  first. A branch that follows an earlier step which no unused sample explains (the client
  went back) stays a ``fork``.
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
        if len(leaves) == len(samples):
            leaves.remove(min(leaves))
        unused.update(leaves)
    return unused


def split_unused(session: Session) -> tuple[list[OpenSegment], list[OpenSegment]]:
    """The session's segments with a trainable token, split into those the client followed
    and those whose only trainable tokens are an unused sample."""
    unused_steps = unused_samples(session)
    used: list[OpenSegment] = []
    unused: list[OpenSegment] = []
    # A segment whose last step was an unused sample: what of it stays (None: nothing).
    ancestors: dict[int, OpenSegment | None] = {}
    for segment in session.segments:
        if not segment.steps or not segment.own_trainable(len(segment.tokens)):
            continue
        head = segment.steps[-1]
        if head.step_id not in unused_steps or segment.carried >= head.completion_end:
            used.append(segment)
            continue
        session.diagnostics["unused_samples"] += 1
        ancestors[id(segment)] = None
        if segment.own_trainable(head.prompt_start):
            kept = segment.copy(segment.split_reason)
            kept.truncate(len(segment.steps) - 1)
            used.append(kept)
            ancestors[id(segment)] = kept
        # A branch off the trajectory, however it was placed.
        segment = segment.copy(SplitReason.FORK)
        segment.make_context(head.prompt_start)
        unused.append(segment)
    return _join_siblings(session, used, unused_steps, ancestors), unused


def _join_siblings(
    session: Session,
    used: list[OpenSegment],
    unused_steps: set[str],
    ancestors: dict[int, OpenSegment | None],
) -> list[OpenSegment]:
    """``used`` with each branch that continued a sibling of an unused first sample joined to
    what that sample's segment kept: one trajectory where the client never went back."""
    prompt_of = {step: key for key, steps in session.samples.items() for step in steps}
    became: dict[int, OpenSegment] = {}  # a used segment → what it is in the output
    taken: set[int] = set()  # joined into a later branch: not output on its own
    for segment in used:
        became[id(segment)] = segment
        if segment.split_reason is not SplitReason.FORK:
            continue
        own = next(s for s in segment.steps if s.completion_start >= segment.carried)
        siblings = session.samples.get(prompt_of.get(own.step_id, b""), [])
        first = siblings[0] if len(siblings) > 1 else ""
        holder = session.segment_of_step.get(first)
        if holder is None or first not in unused_steps or id(holder) not in ancestors:
            continue  # a branch the client went back for
        kept = ancestors[id(holder)]
        if kept is None:  # the first sample began its segment's trainable part: its place
            became[id(segment)] = segment.copy(holder.split_reason)
            continue
        before = became.get(id(kept))  # None: a rebuilt segment moved after its branch
        if before is None or id(before) in taken:
            continue
        cut = len(before.tokens)
        if cut != segment.carried or before.tokens != segment.tokens[:cut]:
            continue
        taken.add(id(before))
        became[id(segment)] = _joined(before, segment)
    return [became[id(s)] for s in used if id(became[id(s)]) not in taken]


def _joined(before: OpenSegment, after: OpenSegment) -> OpenSegment:
    """``after`` (a branch holding ``before``'s tokens as context) with them trainable as in
    ``before``: the two as one segment."""
    cut = len(before.tokens)
    joined = after.copy(before.split_reason)
    joined.loss_mask[:cut] = before.loss_mask
    joined.logprobs[:cut] = before.logprobs
    joined.source[:cut] = before.source
    joined.versions = [*before.versions, *(v for v in after.versions if v.start >= cut)]
    joined.carried = before.carried
    return joined
