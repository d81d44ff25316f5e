"""A segment being built: its tokens with their loss mask, logprobs, logprob sources and
weight versions, its steps and its conversation so far.

Invariants:
- Token ids are copied from the events, never re-encoded, and the tokens before a completion
  are the prompt the engine saw for it.
- Context (a prompt tail, or tokens carried over from an earlier segment) is loss mask 0,
  logprob 0.0, source ``none``, with no weight version; a completion is loss mask 1, the
  engine's logprobs, source ``sampled`` (``constrained`` under constrained decoding), and the
  versions that sampled it. A 0.0 logprob is never passed off as a value.
- Tokens made context (``fork_at``, ``as_context``) stay trainable only in the segment they
  came from, so no token is trainable in two segments.
- ``images`` are the images of the segment's tokens at their offsets there: a step's images
  (every image of its full prompt) re-based to where that prompt sits in the segment. Images are
  prompt, so their runs are context, and a segment is only ever cut after a step's completion
  (``truncate``), so a run is never cut: it is in a segment whole or not at all.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

from schemas.events import (
    LOGPROB_SOURCE_CONSTRAINED,
    LOGPROB_SOURCE_NONE,
    LOGPROB_SOURCE_SAMPLED,
    SegmentStep,
    StepRecorded,
    VersionSpan,
)
from schemas.images import ImageRecord
from schemas.reasons import SplitReason
from workers.assembly.conversation import Turn
from workers.assembly.step_tokens import StepTokens
from workers.routed_experts import SegmentRouting


@dataclass
class OpenSegment:
    chain_id: str
    split_reason: SplitReason | None
    tokens: array[int] = field(default_factory=lambda: array("i"))
    loss_mask: array[int] = field(default_factory=lambda: array("B"))
    logprobs: array[float] = field(default_factory=lambda: array("f"))
    source: array[int] = field(default_factory=lambda: array("B"))
    versions: list[VersionSpan] = field(default_factory=list)
    steps: list[SegmentStep] = field(default_factory=list)
    messages: list[Turn] = field(default_factory=list)  # the conversation so far
    messages_after: list[int] = field(default_factory=list)  # len(messages) after each step
    tools_hash: str = ""
    tools: list[dict[str, Any]] = field(default_factory=list)  # of the latest rendered step
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    last_event_time: float = 0.0
    carried: int = 0  # leading tokens carried over as context from a segment emitted at size
    routing: SegmentRouting = field(default_factory=SegmentRouting)
    images: list[ImageRecord] = field(default_factory=list)

    def extend(self, step: StepRecorded, context: array[int], sampled: StepTokens) -> None:
        # After a rebuild the segment's tokens already hold this step's prompt (context == []).
        prompt_start = self.steps[-1].completion_end if self.steps else 0
        # Whole-buffer copies (the step's arrays are converted once, in StepTokens.of).
        # Context is loss mask 0, logprob 0.0, source none: all zero bytes.
        self.tokens.extend(context)
        self.loss_mask.frombytes(bytes(len(context)))
        self.logprobs.frombytes(bytes(4 * len(context)))
        self.source.frombytes(bytes([LOGPROB_SOURCE_NONE]) * len(context))
        completion_start = len(self.tokens)
        if step.images or self.images:  # the step's full prompt ends where its completion starts
            shift = completion_start - step.prefix_len - len(sampled.tail)
            self.images = [
                image.model_copy(update={"offset": image.offset + shift}) if shift else image
                for image in step.images
            ]
        generated = len(sampled.completion)
        self.tokens.extend(sampled.completion)
        self.loss_mask.frombytes(b"\x01" * generated)
        self.logprobs.extend(sampled.logprobs)
        source = LOGPROB_SOURCE_CONSTRAINED if step.constrained else LOGPROB_SOURCE_SAMPLED
        self.source.frombytes(bytes([source]) * generated)
        self.versions += [
            VersionSpan(
                version=span.version,
                start=completion_start + span.start,
                end=completion_start + span.end,
            )
            for span in step.weight_versions
        ]
        self.steps.append(
            SegmentStep(
                step_id=step.step_id,
                prompt_start=prompt_start,
                completion_start=completion_start,
                completion_end=len(self.tokens),
                prefix=step.prefix,
                finish_reason=step.finish_reason,
                sampling=step.sampling,
                sampling_asked=step.sampling_asked,
            )
        )
        self.routing.add(step.routed_experts)
        if step.prefix == "rendered":  # the whole conversation; the known part keeps its turns
            self.messages += [Turn(m) for m in step.new_messages[len(self.messages) :]]
            self.tools, self.template_kwargs = step.tools, step.template_kwargs
        else:
            self.messages += [Turn(m) for m in step.new_messages]
        self.messages.append(Turn(step.response_message, step.step_id))
        self.messages_after.append(len(self.messages))
        self.tools_hash = step.tools_hash
        self.last_event_time = step.event_time

    def truncate(self, steps: int) -> None:
        """Keep only the first ``steps`` steps (and their tokens and messages)."""
        cut = self.steps[steps - 1].completion_end if steps else 0
        for values in (self.tokens, self.loss_mask, self.logprobs, self.source):
            del values[cut:]
        self.versions = [span for span in self.versions if span.end <= cut]
        self.routing.truncate(cut)
        self.images = [image for image in self.images if image.offset + image.length <= cut]
        del self.steps[steps:]
        del self.messages[self.messages_after[steps - 1] if steps else 0 :]
        del self.messages_after[steps:]
        self.carried = min(self.carried, cut)

    def copy(self, split_reason: SplitReason | None) -> OpenSegment:
        return OpenSegment(
            chain_id=self.chain_id,
            split_reason=split_reason,
            tokens=self.tokens[:],
            loss_mask=self.loss_mask[:],
            logprobs=self.logprobs[:],
            source=self.source[:],
            versions=self.versions[:],
            steps=self.steps[:],
            messages=self.messages[:],
            messages_after=self.messages_after[:],
            tools_hash=self.tools_hash,
            tools=self.tools,
            template_kwargs=self.template_kwargs,
            last_event_time=self.last_event_time,
            carried=self.carried,
            routing=self.routing.copy(),
            images=self.images[:],
        )

    def index_of(self, step_id: str) -> int | None:
        """Where ``step_id`` sits among this segment's steps (None: not here)."""
        for index in range(len(self.steps) - 1, -1, -1):  # usually the last
            if self.steps[index].step_id == step_id:
                return index
        return None

    def fork_at(self, index: int) -> OpenSegment:
        """A branch: this segment's tokens up to the end of its step ``index``, as context
        (they stay trainable here only)."""
        fork = self.copy(SplitReason.FORK)
        fork.truncate(index + 1)
        fork.make_context(len(fork.tokens))
        return fork

    def as_context(self) -> OpenSegment:
        """The continuation of a segment emitted at the size limit: its tokens, all context."""
        following = self.copy(SplitReason.SIZE)
        following.make_context(len(self.tokens))
        return following

    def make_context(self, end: int) -> None:
        """Tokens ``[0, end)`` become context: loss mask 0, no logprob, no version."""
        self.loss_mask[:end] = array("B", bytes(end))
        self.source[:end] = array("B", bytes(end))
        self.logprobs[:end] = array("f", bytes(4 * end))
        self.versions = [
            span if span.start >= end else span.model_copy(update={"start": end})
            for span in self.versions
            if span.end > end
        ]
        self.carried = max(self.carried, end)

    def own_trainable(self, end: int) -> bool:
        """Whether any token before ``end`` is trainable here."""
        return 1 in self.loss_mask[:end].tobytes()  # memchr
