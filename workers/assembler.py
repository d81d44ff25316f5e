"""Steps → training segments: the one entry point workers and replays feed the steps topic to.
Pure logic: no Kafka, no clocks of its own. The parts live in :mod:`workers.assembly`.

Invariants:
- Every sample is its own step, and reaches a segment once. A TITO step extends the segment
  holding its parent; if the parent is not that segment's last step (another sample of the
  same prompt, or a request from an earlier turn), it opens a branch (``split_reason: fork``);
  at close, a branch that went on from a sibling of an unused sample is joined back into the
  trajectory (:mod:`workers.assembly.unused`): only a client that went back makes a fork.
  A rendered step (the ingress rendered the whole conversation) is placed the same way after
  the latest step whose tokens prefix its prompt — a ``cache_miss`` — or, with none, starts a
  new segment: a ``fork`` when its prompt is exactly another segment's first prompt (that
  prompt sampled again), else one whose ``split_reason`` classifies the divergence.
- A segment whose own tokens (beyond context carried over) reach ``max_segment_tokens`` is
  emitted (``finalize_reason: size``); the chain continues in a new segment that holds those
  tokens as context, so no token is trained on twice and none loses its context.
- ``divergence_policy: recompute``: a diverging rendered step whose prompt still holds every turn
  its segment generated replaces that segment (rebuilt on its prompt); otherwise it splits.
- Output is a function of the events alone (ids and times come from the log), so replaying the
  same events yields byte-identical segments.
- No event raises out of :meth:`Assembler.apply`: one that cannot be placed (unknown parent, a
  reused step id, malformed arrays, garbage) comes back with a dead-letter reason
  (:class:`schemas.reasons.DeadLetterReason`) and a detail.
- No segment is made of part of a session. A session met without its start (a TITO step whose
  session was never seen open here, or open sessions whose later steps retention deleted) is
  partial: each of its events, its end included, comes back dead-lettered as ``partial_session``
  and it yields nothing (counted in ``counters["partial_sessions"]``).
- A session closes once (finalize, discard or idle) and then yields its segments, or, when it
  yields none (discarded, or no generated token), one ``SessionDiscarded`` notice saying so.
"""

from __future__ import annotations

import datetime
import logging
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from schemas.events import (
    BuildMode,
    SegmentFinalized,
    SessionDiscarded,
    SessionFinalized,
    SessionOpened,
    StepRecorded,
    steps_topic_adapter,
)
from schemas.reasons import DeadLetterReason, DiscardReason, SplitReason
from workers.assembly.divergence import Decode, classify
from workers.assembly.emit import FinalizeReason, SegmentEmitter
from workers.assembly.ended import Ended, EndedSessions
from workers.assembly.rebuilt import SegmentRebuilder
from workers.assembly.segment import OpenSegment
from workers.assembly.session import Session
from workers.assembly.step_tokens import StepTokens
from workers.assembly.unused import split_unused
from workers.assembly.validation import malformed
from workers.rebuild import Rebuilder

log = logging.getLogger("titoflow.assembler")

StepsEvent = SessionOpened | StepRecorded | SessionFinalized | SessionDiscarded


@dataclass
class StepOutcome:
    """What happened to a step that did not simply extend a segment, and any segment it closed
    (at the size limit)."""

    dead_letter_reason: DeadLetterReason | None = None
    dead_letter_detail: str = ""
    skipped_reason: str | None = None
    segments: list[SegmentFinalized] = field(default_factory=list)


@dataclass
class Closed:
    """A closed session's segments, or the notice that it yields none."""

    segments: list[SegmentFinalized] = field(default_factory=list)
    notice: SessionDiscarded | None = None


@dataclass
class Applied:
    """The result of one record of the steps topic: the event (None if undecodable), the
    segments it closed (or the notice that its session yields none), and why it was
    dead-lettered or skipped, if it was."""

    event: StepsEvent | None
    segments: list[SegmentFinalized] = field(default_factory=list)
    dead_letter_reason: DeadLetterReason | None = None
    dead_letter_detail: str = ""
    skipped_reason: str | None = None
    notice: SessionDiscarded | None = None


class Assembler:
    def __init__(
        self,
        max_segment_tokens: int = 0,
        decode: Decode | None = None,
        rebuilder: Rebuilder | None = None,
        build_mode: BuildMode = "concat",
        recompute: bool = False,
        mask_stale_versions: bool = False,
        partial_rollout: bool = True,
    ) -> None:
        """``decode`` (token ids → text) lets divergences be told apart as retokenization
        (same text, other ids) or template (other text); without it they count as template.
        ``rebuilder`` (the policy's chat template) is what ``last-step`` and ``recompute``
        need; without it segments stay concat and divergences split. ``recompute``: repair
        divergences and mark re-rendered turns for the recompute stage (else split / mask).
        ``mask_stale_versions``: loss mask 0 on tokens of other versions than the latest;
        ``partial_rollout`` off: loss mask 0 on tokens of other versions than the session's
        first (counted in ``counters["version_masked_tokens"]``)."""
        self.max_segment_tokens = max_segment_tokens
        self.decode = decode
        self.recompute = recompute
        self._rebuilds = SegmentRebuilder(rebuilder, recompute)
        self.counters: Counter[str] = Counter()
        self._emitter = SegmentEmitter(
            build_mode, self._rebuilds, mask_stale_versions, not partial_rollout, self.counters
        )
        self._sessions: dict[str, Session] = {}
        # Sessions already ended here: a step for one of them is late, not new, and a second
        # end is refused naming the first.
        self._ended = EndedSessions()
        # Sessions met without their start, by partition: their events are dead-lettered.
        self._partial: dict[str, int] = {}

    @property
    def open_sessions(self) -> list[str]:
        return list(self._sessions)

    def apply(self, value: bytes | None, partition: int, offset: int) -> Applied:
        """Decode and apply one record of the steps topic (what workers and replays share).
        Never raises: an event the assembler fails on comes back with a dead-letter reason."""
        try:
            event = steps_topic_adapter.validate_json(value or b"")
        except ValidationError as exc:
            errors = str(exc.errors(include_url=False)[:3])
            return Applied(
                None,
                dead_letter_reason=DeadLetterReason.UNDECODABLE_EVENT,
                dead_letter_detail=errors,
            )
        try:
            return self._apply(event, partition, offset)
        except Exception as exc:  # a bug must cost one event, not the partition
            log.exception("assembler failed on %s@%d", event.type, offset)
            self.counters["assembler_errors"] += 1
            return Applied(
                event,
                dead_letter_reason=DeadLetterReason.ASSEMBLER_ERROR,
                dead_letter_detail=repr(exc),
            )

    def _apply(self, event: StepsEvent, partition: int, offset: int) -> Applied:
        if event.session_id in self._partial:
            if isinstance(event, SessionFinalized | SessionDiscarded):
                del self._partial[event.session_id]  # its end: nothing more of it is expected
            return Applied(event, dead_letter_reason=DeadLetterReason.PARTIAL_SESSION)
        if isinstance(event, StepRecorded):
            outcome = self.add_step(event, partition, offset)
            applied = Applied(
                event,
                outcome.segments,
                outcome.dead_letter_reason,
                outcome.dead_letter_detail,
                outcome.skipped_reason,
            )
        elif isinstance(event, SessionFinalized):
            self._seen(event.session_id, offset)
            if event.session_id in self._ended:
                return self._ended_again(event)
            closed = self.close(
                event.session_id,
                "finalized",
                event.metadata,
                event.reward,
                event.reward_components,
                at=event.event_time,
            )
            applied = Applied(event, closed.segments, notice=closed.notice)
        elif isinstance(event, SessionDiscarded):
            applied = self.discard(event, partition, offset)
        else:
            if event.session_id not in self._sessions and event.session_id not in self._ended:
                self._sessions[event.session_id] = Session(
                    event.instance_id,
                    partition,
                    offset,
                    offset,
                    dict(event.metadata),
                    channel=event.channel,
                    last_event_time=event.event_time,
                    build_mode=event.options.build_mode,
                )
            applied = Applied(event)
        return applied

    def discard(self, event: SessionDiscarded, partition: int, offset: int) -> Applied:
        """Drop a session's open state and emit nothing but the notice that it was discarded.
        Late steps of it then go to the DLQ, as after a finalize."""
        if event.session_id in self._ended:
            self._seen(event.session_id, offset)
            return self._ended_again(event)
        session = self._sessions.get(event.session_id)
        if session is None:  # discarded before any step: still closed, still announced
            session = Session(None, partition, offset, offset, last_event_time=event.event_time)
            self._sessions[event.session_id] = session
        self._seen(event.session_id, offset)
        self._close(event.session_id, "discarded", event.event_time)
        self.counters["discarded_sessions"] += 1
        notice = event.model_copy(
            update={
                "instance_id": session.instance_id,
                "channel": session.channel,
                "metadata": {**session.metadata, **event.metadata},
            }
        )
        return Applied(event, notice=notice)

    def _ended_again(self, event: SessionFinalized | SessionDiscarded) -> Applied:
        """A finalize or discard of a session that already ended: the first end stands. The
        producer's re-send of that very end is skipped; any other is dead-lettered (replicas
        refuse a second end with a 409 once they know of the first, so only a race gets here)."""
        ended = self._ended[event.session_id]
        how = "finalized" if isinstance(event, SessionFinalized) else "discarded"
        if (how, event.event_time) == (ended.how, ended.at):
            self.counters["repeated_ends"] += 1
            return Applied(event, skipped_reason="the session's end, sent again")
        self.counters["ends_after_end"] += 1
        when = datetime.datetime.fromtimestamp(ended.at, datetime.UTC).isoformat()
        return Applied(
            event,
            dead_letter_reason=DeadLetterReason.ALREADY_ENDED,
            dead_letter_detail=f"{ended.how} at {when}",
        )

    def _seen(self, session_id: str, offset: int) -> None:
        """Stretch the offset span of the session an event belongs to, open or closed."""
        session = self._sessions.get(session_id)
        if session is not None:
            session.last_offset = max(session.last_offset, offset)
            return
        self._ended.seen(session_id, offset)

    def add_step(self, step: StepRecorded, partition: int, offset: int) -> StepOutcome:
        self._seen(step.session_id, offset)
        session = self._sessions.get(step.session_id)
        if session is None:
            if step.session_id in self._ended:
                self.counters["late_steps"] += 1
                return StepOutcome(dead_letter_reason=DeadLetterReason.LATE_STEP)
            if step.prefix == "tito":
                # Its session began below where this worker started reading: what follows
                # would be a tail of it, never to be emitted as if it were the whole.
                self._mark_partial(step.session_id, partition)
                return StepOutcome(
                    dead_letter_reason=DeadLetterReason.PARTIAL_SESSION,
                    dead_letter_detail="its session's start was not read here",
                )
            session = Session(step.instance_id, partition, offset, offset)
            self._sessions[step.session_id] = session
        reason = malformed(step)
        if reason:
            self.counters["malformed_steps"] += 1
            return StepOutcome(
                dead_letter_reason=DeadLetterReason.MALFORMED_STEP, dead_letter_detail=reason
            )
        tokens = StepTokens.of(step)
        known = session.digests.get(step.step_id)
        if known is not None:
            if known == tokens.digest:  # the producer's re-send, or a redelivery
                self.counters["duplicate_steps"] += 1
                return StepOutcome(skipped_reason="duplicate step id")
            self.counters["conflicting_steps"] += 1
            return StepOutcome(dead_letter_reason=DeadLetterReason.STEP_ID_CONFLICT)
        session.instance_id = session.instance_id or step.instance_id
        session.last_event_time = step.event_time
        if session.first_version is None and step.weight_versions:
            session.first_version = step.weight_versions[0].version
        placed = self._place(session, step, tokens.tail)
        if isinstance(placed, DeadLetterReason):
            self.counters[str(placed)] += 1
            # A segment without its prefix would be a wrong sample; keep the event for replay.
            return StepOutcome(dead_letter_reason=placed)
        segment, context, anchor = placed
        if step.tool_parse_error:
            session.diagnostics["tool_parse_errors"] += 1
        segment.extend(step, context, tokens)
        session.record(step.step_id, segment, tokens, context, anchor)
        if 0 < self.max_segment_tokens <= len(segment.tokens) - segment.carried:
            session.replace(segment, segment.as_context())
            emitted = self._emitter.emit(step.session_id, session, segment, "size")
            return StepOutcome(segments=[emitted])
        return StepOutcome()

    def _place(
        self, session: Session, step: StepRecorded, tail: array[int]
    ) -> tuple[OpenSegment, array[int], str | None] | DeadLetterReason:
        """The segment this step extends, the context tokens it adds there and the step it
        follows (its anchor), or why it cannot be placed."""
        if step.prefix == "tito":
            parent = session.segment_of_step.get(step.parent_step_id or "")
            if parent is None:
                return DeadLetterReason.UNKNOWN_PARENT_STEP
            index = parent.index_of(step.parent_step_id or "")
            if index is None or parent.steps[index].completion_end != step.prefix_len:
                return DeadLetterReason.PREFIX_LENGTH_MISMATCH
            return session.follow(parent, index), tail, step.parent_step_id
        prompt = tail  # rendered: the whole prompt
        found = session.latest_prefix(prompt)
        if isinstance(found, tuple):
            segment, index = found
            session.diagnostics["cache_miss"] += 1
            self.counters["divergence_cache_miss"] += 1
            end = segment.steps[index].completion_end
            return session.follow(segment, index), prompt[end:], segment.steps[index].step_id
        if found:  # the prompt of a segment's first step, sampled again: a branch of its own
            session.diagnostics["forks"] += 1
            return session.start(step.chain_id, SplitReason.FORK), prompt, None
        if not session.segments:
            return session.start(step.chain_id, None), prompt, None
        latest = session.segments[-1]
        reason = classify(latest, step, self.decode)
        session.diagnostics[reason] += 1
        self.counters[f"divergence_{reason}"] += 1
        if self.recompute:
            rebuilt = self._rebuilds.on_prompt(latest, step)
            session.diagnostics["rebuilt" if rebuilt else "rebuild_fallback"] += 1
            if rebuilt is not None:
                session.replace(latest, rebuilt)
                return rebuilt, array("i"), None
        return session.start(step.chain_id, reason), prompt, None

    def finalize(
        self,
        session_id: str,
        reason: FinalizeReason,
        metadata: dict[str, Any] | None = None,
    ) -> list[SegmentFinalized]:
        """Close a session and return its segments (none if it is unknown here)."""
        return self.close(session_id, reason, metadata).segments

    def close(
        self,
        session_id: str,
        reason: FinalizeReason,
        metadata: dict[str, Any] | None = None,
        reward: float | None = None,
        reward_components: dict[str, float] | None = None,
        at: float | None = None,
    ) -> Closed:
        """Close a session: its segments (the last one marked ``last_of_session``), or, for a
        known session without a generated token, the ``empty`` notice. ``at``: when it ended
        (the finalize's event time; None: now)."""
        if self._partial.pop(session_id, None) is not None:
            return Closed()  # its events went to the dead letters
        session = self._close(session_id, reason, time.time() if at is None else at)
        if session is None:
            self.counters["finalize_unknown_session"] += 1
            return Closed()
        session.metadata.update(metadata or {})
        session.reward = reward
        session.reward_components = dict(reward_components or {})
        used, unused = split_unused(session)
        kept = [*unused, *used]  # the last of session is a used one: readers may skip the rest
        segments = [
            self._emitter.emit(
                session_id, session, segment, reason, segment is kept[-1], index < len(unused)
            )
            for index, segment in enumerate(kept)
        ]
        if segments:
            return Closed(segments)
        notice = SessionDiscarded(
            session_id=session_id,
            event_time=session.last_event_time,
            reason=DiscardReason.EMPTY,
            instance_id=session.instance_id,
            channel=session.channel,
            metadata=session.metadata,
        )
        return Closed(notice=notice)

    def _close(self, session_id: str, how: str, at: float) -> Session | None:
        """Take a session out of the open ones, leaving a tombstone (late steps are late)."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            return None
        span = (session.first_offset, session.last_offset)
        self._ended.add(session_id, Ended(session.partition, how, at), span)
        return session

    def drop_partitions(self, partitions: set[int]) -> list[str]:
        """Forget (and return) sessions of partitions this worker no longer owns; whoever owns
        them next re-reads them from the committed offset, finalized ones included."""
        dropped = [s for s, v in self._sessions.items() if v.partition in partitions]
        for session_id in dropped:
            del self._sessions[session_id]
        partial = [s for s, p in self._partial.items() if p in partitions]
        for session_id in partial:
            del self._partial[session_id]
        self._ended.forget(partitions)
        return dropped + partial

    def lose_partition(self, partition: int) -> list[str]:
        """Events of ``partition`` were deleted unread (retention passed this worker's reading):
        its open sessions lost steps, so they become partial (and are returned)."""
        lost = [s for s, v in self._sessions.items() if v.partition == partition]
        for session_id in lost:
            del self._sessions[session_id]
            self._mark_partial(session_id, partition)
        return lost

    def _mark_partial(self, session_id: str, partition: int) -> None:
        self._partial[session_id] = partition
        self.counters["partial_sessions"] += 1

    def commit_offset(self, partition: int, next_offset: int) -> int:
        """The offset a consumer may commit for ``partition`` after reading up to ``next_offset``:
        never inside a session, open or finalized (see :mod:`workers.assembly.ended`)."""
        starts = (s.first_offset for s in self._sessions.values() if s.partition == partition)
        return self._ended.commit_offset(partition, next_offset, starts)
