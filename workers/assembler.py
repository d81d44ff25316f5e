"""Steps → training segments (concat/TITO mode). Pure logic: no Kafka, no clocks of its own.

Invariants:
- A segment is a linear chain of steps. Each step adds its prompt tail as context (loss mask 0,
  logprob source ``none``) and its completion as generated tokens (mask 1, the engine's logprobs,
  source ``sampled``). Token ids are copied from the events, never re-encoded.
- A TITO step extends the segment holding its parent; if the parent is not that segment's last
  step, the segment forks (a copy up to the parent). A rendered step extends an open segment
  whose tokens are a prefix of its prompt, else it starts a new segment (``split_reason``).
- Output is a function of the events alone (ids and times come from the log), so replaying the
  same events yields byte-identical segments, and a segment's id is that of its last step.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Literal

from schemas.events import (
    LOGPROB_SOURCE_NONE,
    LOGPROB_SOURCE_SAMPLED,
    SegmentFinalized,
    SegmentStep,
    StepRecorded,
)

FinalizeReason = Literal["finalized", "idle"]
MAX_TOMBSTONES = 100_000


@dataclass
class _Segment:
    chain_id: str
    split_reason: str | None
    tokens: array[int] = field(default_factory=lambda: array("i"))
    loss_mask: array[int] = field(default_factory=lambda: array("B"))
    logprobs: array[float] = field(default_factory=lambda: array("f"))
    source: array[int] = field(default_factory=lambda: array("B"))
    steps: list[SegmentStep] = field(default_factory=list)
    last_event_time: float = 0.0

    @property
    def head_step_id(self) -> str | None:
        return self.steps[-1].step_id if self.steps else None

    def extend(self, step: StepRecorded, context: list[int]) -> None:
        prompt_start = len(self.tokens)
        self.tokens.extend(context)
        self.loss_mask.extend(bytes(len(context)))
        self.logprobs.extend([0.0] * len(context))
        self.source.extend([LOGPROB_SOURCE_NONE] * len(context))
        completion_start = len(self.tokens)
        self.tokens.extend(step.completion_ids)
        self.loss_mask.extend([1] * len(step.completion_ids))
        self.logprobs.extend(step.completion_logprobs)
        self.source.extend([LOGPROB_SOURCE_SAMPLED] * len(step.completion_ids))
        self.steps.append(
            SegmentStep(
                step_id=step.step_id,
                prompt_start=prompt_start,
                completion_start=completion_start,
                completion_end=len(self.tokens),
                prefix=step.prefix,
                finish_reason=step.finish_reason,
            )
        )
        self.last_event_time = step.event_time

    def holds_as_head(self, step: StepRecorded) -> bool:
        """Whether ``step`` is this segment's last step, token for token (a redelivery)."""
        if self.head_step_id != step.step_id:
            return False
        head = self.steps[-1]
        tail: list[int] = self.tokens[head.prompt_start : head.completion_start].tolist()
        completion: list[int] = self.tokens[head.completion_start :].tolist()
        return tail == step.prompt_tail_ids and completion == step.completion_ids

    def drop_head(self) -> None:
        cut = self.steps.pop().prompt_start
        for values in (self.tokens, self.loss_mask, self.logprobs, self.source):
            del values[cut:]

    def fork_at(self, step_id: str) -> _Segment:
        """A new segment holding this one's tokens up to the end of ``step_id``."""
        index = next(i for i, s in enumerate(self.steps) if s.step_id == step_id)
        end = self.steps[index].completion_end
        return _Segment(
            chain_id=self.chain_id,
            split_reason="fork",
            tokens=self.tokens[:end],
            loss_mask=self.loss_mask[:end],
            logprobs=self.logprobs[:end],
            source=self.source[:end],
            steps=self.steps[: index + 1],
            last_event_time=self.last_event_time,
        )


@dataclass
class _Session:
    instance_id: str | None
    partition: int
    first_offset: int
    segments: list[_Segment] = field(default_factory=list)
    segment_of_step: dict[str, _Segment] = field(default_factory=dict)


@dataclass
class StepOutcome:
    """What happened to a step that did not simply extend a segment."""

    dead_letter_reason: str | None = None
    skipped_reason: str | None = None


class Assembler:
    def __init__(self) -> None:
        self._sessions: dict[str, _Session] = {}
        # Sessions already finalized here: a step arriving for one of them is late, not new.
        self._finalized: OrderedDict[str, None] = OrderedDict()
        self.counters: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    @property
    def open_sessions(self) -> list[str]:
        return list(self._sessions)

    def add_step(self, step: StepRecorded, partition: int, offset: int) -> StepOutcome:
        session = self._sessions.get(step.session_id)
        if session is None:
            if step.session_id in self._finalized:
                self._count("late_steps")
                return StepOutcome(dead_letter_reason="step for a session already finalized")
            if step.prefix == "tito":
                # Its parent sits below this worker's start offset, so the session was complete
                # when the offset was committed: this is a replayed event already assembled.
                self._count("replayed_orphan_steps")
                return StepOutcome(skipped_reason="parent step precedes the committed offset")
            session = _Session(step.instance_id, partition, offset)
            self._sessions[step.session_id] = session
        earlier = session.segment_of_step.get(step.step_id)
        if earlier is not None:
            if earlier.holds_as_head(step):
                self._count("duplicate_steps")
                return StepOutcome(skipped_reason="duplicate step id")
            if earlier.head_step_id != step.step_id:
                self._count("late_retries")
                return StepOutcome(dead_letter_reason="retried step after its chain moved on")
            # A retried turn (same parent and prompt, new sample) published after the first try:
            # the client saw the later one, so it replaces the first.
            earlier.drop_head()
            self._count("superseded_steps")
        placed = self._place(session, step)
        if isinstance(placed, str):
            self._count(placed)
            # A segment without its prefix would be a wrong sample; keep the event for replay.
            return StepOutcome(dead_letter_reason=placed)
        segment, context = placed
        segment.extend(step, context)
        session.segment_of_step[step.step_id] = segment
        return StepOutcome()

    def _place(self, session: _Session, step: StepRecorded) -> tuple[_Segment, list[int]] | str:
        """The segment this step extends and the context tokens it adds there, or why none can."""
        if step.prefix == "tito" and step.parent_step_id is not None:
            parent = session.segment_of_step.get(step.parent_step_id)
            if parent is None:
                return "unknown_parent_step"
            if parent.head_step_id != step.parent_step_id:
                parent = parent.fork_at(step.parent_step_id)
                session.segments.append(parent)
                self._count("forks")
            if len(parent.tokens) != step.prefix_len:
                return "prefix_length_mismatch"
            return parent, step.prompt_tail_ids
        prompt = step.prompt_tail_ids
        for segment in reversed(session.segments):
            n = len(segment.tokens)
            if n < len(prompt) and segment.tokens.tolist() == prompt[:n]:
                self._count("rendered_prefix_matches")
                return segment, prompt[n:]
        reason = "rendered_prefix_diverged" if session.segments else None
        if reason:
            self._count("rendered_prefix_divergences")
        return self._new_segment(session, step, reason), prompt

    def _new_segment(self, session: _Session, step: StepRecorded, reason: str | None) -> _Segment:
        segment = _Segment(chain_id=step.chain_id, split_reason=reason)
        session.segments.append(segment)
        return segment

    def finalize(
        self,
        session_id: str,
        reason: FinalizeReason,
        metadata: dict[str, Any] | None = None,
    ) -> list[SegmentFinalized]:
        """Close a session and return its segments (none if it is unknown here)."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            self._count("finalize_unknown_session")
            return []
        self._finalized[session_id] = None
        while len(self._finalized) > MAX_TOMBSTONES:
            self._finalized.popitem(last=False)
        return [
            _segment_event(session_id, session, segment, reason, metadata or {})
            for segment in session.segments
            if segment.steps
        ]

    def drop_partitions(self, partitions: set[int]) -> list[str]:
        """Forget (and return) sessions of partitions this worker no longer owns."""
        dropped = [s for s, v in self._sessions.items() if v.partition in partitions]
        for session_id in dropped:
            del self._sessions[session_id]
        return dropped

    def oldest_open_offset(self, partition: int) -> int | None:
        """Committing below this keeps every open session's events re-readable after a crash."""
        offsets = [s.first_offset for s in self._sessions.values() if s.partition == partition]
        return min(offsets) if offsets else None


def _segment_event(
    session_id: str,
    session: _Session,
    segment: _Segment,
    reason: FinalizeReason,
    metadata: dict[str, Any],
) -> SegmentFinalized:
    # A step ends at most one segment, so (session, last step) names a segment. A worker that
    # re-reads a finished session from mid-way (its start was below the committed offset)
    # rebuilds a tail of a segment already emitted: same last step, same id, dropped downstream.
    last_step_id = segment.steps[-1].step_id
    segment_id = hashlib.sha256(f"{session_id}\0{last_step_id}".encode()).hexdigest()[:32]
    return SegmentFinalized(
        session_id=session_id,
        event_time=segment.last_event_time,
        segment_id=segment_id,
        chain_id=segment.chain_id,
        instance_id=session.instance_id,
        token_ids=segment.tokens.tolist(),
        loss_mask=segment.loss_mask.tolist(),
        logprobs=segment.logprobs.tolist(),
        logprob_source=segment.source.tolist(),
        steps=segment.steps,
        finalize_reason=reason,
        split_reason=segment.split_reason,
        metadata=metadata,
    )
