"""Segments rebuilt on a re-rendered token sequence: on a diverging prompt (``divergence_policy:
recompute``) and at emit time (``build_mode: last-step``).

Invariants:
- A rebuilt segment's generated turns are the segment's own steps, found as the template's
  assistant turns in the new tokens; when they cannot all be found, nothing is rebuilt.
- A token keeps its sampled logprob and routed experts only where it and all its context are
  unchanged; the rest of a generated turn waits for the recompute stage (source 3) or is
  masked, as :func:`workers.rebuild.relabel` labels it.
- A segment holding tokens carried over from one emitted at size is never rebuilt (those were
  emitted already), nor is one whose generated turns the new prompt dropped (compaction).
- A rebuilt segment's images are at their runs in its new tokens: on a step's prompt, the step's
  own (set when the step extends it); re-rendered, the segment's images in order, each on the
  next placeholder run, which must be as long as its record says, else nothing is rebuilt.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

from schemas.events import StepRecorded
from titoflow.errors import TemplateError
from workers.assembly.conversation import Turn, message_key
from workers.assembly.segment import OpenSegment
from workers.rebuild import Rebuilder, relabel


@dataclass(frozen=True)
class SegmentRebuilder:
    """``rebuilder``: the policy's chat template (None: nothing is rebuilt). ``recompute``:
    mark re-rendered tokens for the recompute stage (else mask them)."""

    rebuilder: Rebuilder | None
    recompute: bool

    def on_prompt(self, segment: OpenSegment, step: StepRecorded) -> OpenSegment | None:
        """``segment`` rebuilt on ``step``'s rendered prompt, if that prompt still holds every
        turn the segment generated (in order) and nothing of it was emitted already."""
        if segment.carried:
            return None
        generated = [t for t in segment.messages if t.step_id]
        turns: list[Turn] = []
        for message in step.new_messages:
            found = bool(generated) and message.get("role") == "assistant"
            if found and message_key(message) == generated[0].key:
                turns.append(Turn(message, generated.pop(0).step_id))
            else:
                turns.append(Turn(message))
        if generated:
            return None  # turns were dropped (compaction): keep them in their own segment
        return self._relabelled(segment, turns, step.prompt_tail_ids)

    def last_step(self, segment: OpenSegment) -> OpenSegment | None:
        """The segment's final conversation re-rendered (None: it cannot be, keep concat)."""
        if self.rebuilder is None or segment.carried:  # carried tokens were emitted already
            return None
        if any("role" not in t.message for t in segment.messages):
            return None  # token-level (white-box) steps carry no conversation to render
        messages = [t.message for t in segment.messages]
        try:
            tokens = self.rebuilder.render(messages, segment.tools, segment.template_kwargs)
        except TemplateError:
            return None
        rebuilt = self._relabelled(segment, segment.messages, tokens)
        if rebuilt is None or not segment.images:
            return rebuilt
        runs = self.rebuilder.image_runs(tokens)
        if [length for _, length in runs] != [image.length for image in segment.images]:
            return None
        rebuilt.images = [
            image.model_copy(update={"offset": offset})
            for image, (offset, _) in zip(segment.images, runs, strict=True)
        ]
        return rebuilt

    def _relabelled(
        self, segment: OpenSegment, turns: list[Turn], tokens: list[int]
    ) -> OpenSegment | None:
        """A segment of ``tokens`` (a render of ``turns``) whose generated turns are
        ``segment``'s steps; None when the template's assistant turns cannot be found in
        ``tokens``."""
        if self.rebuilder is None:
            return None
        spans = self.rebuilder.assistant_spans(tokens)
        assistant = [t for t in turns if t.message.get("role") == "assistant"]
        if len(spans) != len(assistant):
            return None
        span_of = {t.step_id: span for t, span in zip(assistant, spans, strict=True) if t.step_id}
        labels = relabel(
            segment.tokens,
            segment.loss_mask,
            segment.logprobs,
            segment.source,
            segment.versions,
            tokens,
            list(span_of.values()),
            self.recompute,
        )
        # Routed experts, like sampled logprobs, hold only where the context is unchanged.
        routing = segment.routing.copy()
        routing.truncate(labels.same)
        rebuilt = OpenSegment(
            chain_id=segment.chain_id,
            split_reason=segment.split_reason,
            tokens=array("i", tokens),
            loss_mask=labels.loss_mask,
            logprobs=labels.logprobs,
            source=labels.source,
            versions=labels.versions,
            messages=turns,
            tools_hash=segment.tools_hash,
            tools=segment.tools,
            template_kwargs=segment.template_kwargs,
            last_event_time=segment.last_event_time,
            routing=routing,
        )
        old_steps = {s.step_id: s for s in segment.steps}
        for index, turn in enumerate(turns):
            if turn.step_id is None:
                continue
            start, end = span_of[turn.step_id]
            old = old_steps[turn.step_id]
            prompt_start = rebuilt.steps[-1].completion_end if rebuilt.steps else 0
            rebuilt.steps.append(
                old.model_copy(
                    update={
                        "prompt_start": prompt_start,
                        "completion_start": start,
                        "completion_end": end,
                    }
                )
            )
            rebuilt.messages_after.append(index + 1)
        return rebuilt
