"""Step validation: what makes a step event unusable whatever its session holds (the
details of the ``malformed_step`` dead-letter reason).

Invariant: a reason depends on the event alone, so every worker and every replay dead-letters
a malformed step with the same reason, before any segment holds a token of it.
"""

from __future__ import annotations

from schemas.events import StepRecorded


def malformed(step: StepRecorded) -> str | None:
    """Why ``step`` is unusable (None: it is not)."""
    if len(step.completion_logprobs) != len(step.completion_ids):
        return "completion_logprobs and completion_ids differ in length"
    if step.prefix == "tito" and step.parent_step_id in (None, step.step_id):
        return "a tito step names no parent (or itself)"
    if step.prefix == "rendered" and (step.parent_step_id is not None or step.prefix_len):
        return "a rendered step names a parent prefix"
    if step.prefix == "rendered" and not step.prompt_tail_ids:
        return "a rendered step with an empty prompt"
    if any(not 0 <= s.start <= s.end <= len(step.completion_ids) for s in step.weight_versions):
        return "a weight-version span outside the completion"
    return None
