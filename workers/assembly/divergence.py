"""Why a fully rendered prompt does not continue its session's latest segment.

Invariant: a divergence gets one class, the first that holds of ``tool_change`` (other tools),
``history_rewrite`` (the conversation itself differs: edited, compacted, injected into),
``retokenization`` (where the ids part, the same text: needs a decoder) and ``template`` (the
template renders history differently from what was sampled).
"""

from __future__ import annotations

from collections.abc import Callable

from schemas.events import StepRecorded
from schemas.reasons import SplitReason
from workers.assembly.conversation import message_key
from workers.assembly.segment import OpenSegment

Decode = Callable[[list[int]], str]


def classify(segment: OpenSegment, step: StepRecorded, decode: Decode | None) -> SplitReason:
    """The class of the divergence of ``step``'s rendered prompt from ``segment``."""
    if step.tools_hash != segment.tools_hash:
        return SplitReason.TOOL_CHANGE
    conversation = [message_key(m) for m in step.new_messages]
    if conversation[: len(segment.messages)] != [t.key for t in segment.messages]:
        # Edited, compacted, or injected into (Claude Code reminders).
        return SplitReason.HISTORY_REWRITE
    # The same conversation, other tokens: the template renders history differently from
    # what was sampled. Where the ids part, same text means a retokenization.
    prompt = step.prompt_tail_ids
    tokens = segment.tokens.tolist()
    at = next(i for i, (a, b) in enumerate(zip(tokens, prompt, strict=False)) if a != b)
    span = next((s for s in segment.steps if s.completion_start <= at < s.completion_end), None)
    if span is None or decode is None:
        return SplitReason.TEMPLATE
    sampled = decode(tokens[span.completion_start : span.completion_end])
    rendered = decode(prompt[span.completion_start :])
    return SplitReason.RETOKENIZATION if rendered.startswith(sampled) else SplitReason.TEMPLATE
