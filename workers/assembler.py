"""Steps → training segments. Pure logic: no Kafka, no clocks of its own.

Invariants:
- Every sample is its own step, and reaches a segment once. A segment is a linear chain of
  steps. Each step adds its prompt tail as context (loss mask 0, logprob source ``none``) and its
  completion as generated tokens (mask 1, the engine's logprobs, source ``sampled``, the weight
  versions that sampled them). Token ids are copied from the events, never re-encoded, and the
  tokens before a completion are the prompt the engine saw for it.
- A TITO step extends the segment holding its parent. If the parent is not that segment's last
  step (another sample of the same prompt, or a request from an earlier turn), it opens a branch:
  a new segment (``split_reason: fork``) whose tokens up to the parent are context, so no token
  is trainable in two segments. A rendered step (the ingress rendered the whole conversation) is
  placed the same way after the latest step whose tokens prefix its prompt — a ``cache_miss`` —
  or, with none, starts a new segment: a ``fork`` when its prompt is exactly another segment's
  first prompt (that prompt sampled again), else one whose ``split_reason`` classifies the
  divergence.
- Samples of one prompt that nobody continued, while a sibling was continued (or, when none
  was, all but the latest), are emitted on their own, marked ``unused_sample``: the ancestors
  they follow stay trainable in the segment that continued them.
- A segment whose own tokens (beyond context carried over) reach ``max_segment_tokens`` is
  emitted (``finalize_reason: size``); the chain continues in a new segment that holds those
  tokens as context (loss mask 0), so no token is trained on twice and none loses its context.
- ``divergence_policy: recompute``: a diverging rendered step whose prompt still holds every turn
  its segment generated replaces that segment: its prompt becomes the segment's tokens, the
  earlier turns stay trainable (sampled logprobs where the tokens and their context are
  unchanged, the rest marked for the recompute stage, source 3) — see :mod:`workers.rebuild`.
  Otherwise (compaction dropped turns) it splits.
- ``build_mode: last-step`` re-renders each segment's final conversation at emit time, assistant
  turns the model generated trainable, labelled the same way.
- Output is a function of the events alone (ids and times come from the log), so replaying the
  same events yields byte-identical segments, and a segment's id is that of its last step.
- No event raises out of :meth:`Assembler.apply`: one that cannot be placed (unknown parent, a
  reused step id, malformed arrays, garbage) comes back with a dead-letter reason.
- A session closes once (finalize, discard or idle) and then yields its segments, or, when it
  yields none (discarded, or no generated token), one ``SessionDiscarded`` notice saying so.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import math
import time
from array import array
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import ValidationError

from schemas.events import (
    LOGPROB_SOURCE_CONSTRAINED,
    LOGPROB_SOURCE_NONE,
    LOGPROB_SOURCE_RECOMPUTED,
    LOGPROB_SOURCE_SAMPLED,
    BuildMode,
    SegmentFinalized,
    SegmentStep,
    SessionDiscarded,
    SessionFinalized,
    SessionOpened,
    StepRecorded,
    VersionSpan,
    steps_topic_adapter,
)
from titoflow.errors import TemplateError
from workers.rebuild import Rebuilder, relabel
from workers.routed_experts import SegmentRouting
from workers.versions import mask_stale_versions

log = logging.getLogger("titoflow.assembler")

StepsEvent = SessionOpened | StepRecorded | SessionFinalized | SessionDiscarded
FinalizeReason = Literal["finalized", "idle", "size"]
Decode = Callable[[list[int]], str]
MAX_TOMBSTONES = 100_000


def _message_key(message: dict[str, Any]) -> tuple[Any, ...]:
    """A message as the conversation sees it: reasoning left out (clients drop it), tool-call
    arguments compared as JSON values."""
    calls = tuple(
        (
            call.get("id"),
            call["function"]["name"],
            json.dumps(call["function"].get("arguments"), sort_keys=True),
        )
        for call in message.get("tool_calls") or ()
    )
    return (message.get("role"), message.get("content"), calls, message.get("tool_call_id"))


@dataclass(frozen=True)
class _Sampled:
    """A step's token arrays, converted from the event's lists once, and their digests (each
    byte hashed once: the event's digest and the prompt keys are made of them)."""

    tail: array[int]
    completion: array[int]
    logprobs: array[float]
    tail_digest: bytes
    completion_digest: bytes
    digest: bytes  # the whole event's content: a redelivery matches it, another step does not

    @classmethod
    def of(cls, step: StepRecorded) -> _Sampled:
        tail, completion = array("i", step.prompt_tail_ids), array("i", step.completion_ids)
        logprobs = array("f", step.completion_logprobs)
        tail_digest, completion_digest = _hash(tail), _hash(completion)
        head = f"{step.parent_step_id}\0{step.prefix}\0{step.prefix_len}\0".encode()
        digest = _hash(head + tail_digest + completion_digest, logprobs)
        return cls(tail, completion, logprobs, tail_digest, completion_digest, digest)


@dataclass(frozen=True)
class _Turn:
    """A message of a segment's conversation; ``step_id`` names the step that generated it."""

    message: dict[str, Any]
    step_id: str | None = None

    @property
    def key(self) -> tuple[Any, ...]:
        return _message_key(self.message)


@dataclass
class _Segment:
    chain_id: str
    split_reason: str | None
    tokens: array[int] = field(default_factory=lambda: array("i"))
    loss_mask: array[int] = field(default_factory=lambda: array("B"))
    logprobs: array[float] = field(default_factory=lambda: array("f"))
    source: array[int] = field(default_factory=lambda: array("B"))
    versions: list[VersionSpan] = field(default_factory=list)
    steps: list[SegmentStep] = field(default_factory=list)
    messages: list[_Turn] = field(default_factory=list)  # the conversation so far
    messages_after: list[int] = field(default_factory=list)  # len(messages) after each step
    tools_hash: str = ""
    tools: list[dict[str, Any]] = field(default_factory=list)  # of the latest rendered step
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    last_event_time: float = 0.0
    carried: int = 0  # leading tokens carried over as context from a segment emitted at size
    routing: SegmentRouting = field(default_factory=SegmentRouting)

    @property
    def head_step_id(self) -> str | None:
        return self.steps[-1].step_id if self.steps else None

    def extend(self, step: StepRecorded, context: array[int], sampled: _Sampled) -> None:
        # After a rebuild the segment's tokens already hold this step's prompt (context == []).
        prompt_start = self.steps[-1].completion_end if self.steps else 0
        # Whole-buffer copies (the step's arrays are converted once, in add_step).
        # Context is loss mask 0, logprob 0.0, source none: all zero bytes.
        self.tokens.extend(context)
        self.loss_mask.frombytes(bytes(len(context)))
        self.logprobs.frombytes(bytes(4 * len(context)))
        self.source.frombytes(bytes([LOGPROB_SOURCE_NONE]) * len(context))
        completion_start = len(self.tokens)
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
            )
        )
        self.routing.add(step.routed_experts)
        if step.prefix == "rendered":  # the whole conversation; the known part keeps its turns
            self.messages += [_Turn(m) for m in step.new_messages[len(self.messages) :]]
            self.tools, self.template_kwargs = step.tools, step.template_kwargs
        else:
            self.messages += [_Turn(m) for m in step.new_messages]
        self.messages.append(_Turn(step.response_message, step.step_id))
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
        del self.steps[steps:]
        del self.messages[self.messages_after[steps - 1] if steps else 0 :]
        del self.messages_after[steps:]
        self.carried = min(self.carried, cut)

    def copy(self, split_reason: str | None) -> _Segment:
        return _Segment(
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
        )

    def index_of(self, step_id: str) -> int | None:
        """Where ``step_id`` sits among this segment's steps (None: not here)."""
        for index in range(len(self.steps) - 1, -1, -1):  # usually the last
            if self.steps[index].step_id == step_id:
                return index
        return None

    def fork_at(self, index: int) -> _Segment:
        """A branch: this segment's tokens up to the end of its step ``index``, as context
        (they stay trainable here only)."""
        fork = self.copy("fork")
        fork.truncate(index + 1)
        fork.make_context(len(fork.tokens))
        return fork

    def as_context(self) -> _Segment:
        """The continuation of a segment emitted at the size limit: its tokens, all context."""
        following = self.copy("size")
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


@dataclass
class _Session:
    instance_id: str | None
    partition: int
    first_offset: int
    last_offset: int = -1
    metadata: dict[str, Any] = field(default_factory=dict)
    channel: str | None = None
    last_event_time: float = 0.0  # from the log, so a notice about the session is replayable
    reward: float | None = None
    reward_components: dict[str, float] = field(default_factory=dict)
    segments: list[_Segment] = field(default_factory=list)
    segment_of_step: dict[str, _Segment] = field(default_factory=dict)
    # Per step: a digest of its event (a redelivery matches it), the key of its prompt and of
    # its prompt + completion (a chain of digests: equal keys, equal tokens).
    digests: dict[str, bytes] = field(default_factory=dict)
    full_keys: dict[str, bytes] = field(default_factory=dict)
    samples: dict[bytes, list[str]] = field(default_factory=dict)  # prompt key → its samples
    continued: set[str] = field(default_factory=set)  # steps some later step follows
    diagnostics: Counter[str] = field(default_factory=Counter)
    build_mode: BuildMode | None = None  # SessionOpened's options.build_mode


@dataclass
class StepOutcome:
    """What happened to a step that did not simply extend a segment, and any segment it closed
    (at the size limit)."""

    dead_letter_reason: str | None = None
    skipped_reason: str | None = None
    segments: list[SegmentFinalized] = field(default_factory=list)


@dataclass(frozen=True)
class _Ended:
    """How and when a session ended here (a tombstone)."""

    partition: int
    how: str  # finalized, discarded or idle
    at: float


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
    dead_letter_reason: str | None = None
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
    ) -> None:
        """``decode`` (token ids → text) lets divergences be told apart as retokenization
        (same text, other ids) or template (other text); without it they count as template.
        ``rebuilder`` (the policy's chat template) is what ``last-step`` and ``recompute``
        need; without it segments stay concat and divergences split. ``recompute``: repair
        divergences and mark re-rendered turns for the recompute stage (else split / mask).
        ``mask_stale_versions``: loss mask 0 on tokens of other versions than the latest."""
        self.max_segment_tokens = max_segment_tokens
        self.decode = decode
        self.rebuilder = rebuilder
        self.build_mode = build_mode
        self.recompute = recompute
        self.mask_stale_versions = mask_stale_versions
        self._sessions: dict[str, _Session] = {}
        # Sessions already ended here: a step for one of them is late, not new, and a second
        # end is refused naming the first.
        self._finalized: OrderedDict[str, _Ended] = OrderedDict()
        # Offsets [first, last] of finalized sessions per partition, kept while a commit point
        # could still fall inside them (see commit_offset).
        self._closed_spans: dict[int, dict[str, tuple[int, int]]] = {}
        self.counters: Counter[str] = Counter()

    @property
    def open_sessions(self) -> list[str]:
        return list(self._sessions)

    def apply(self, value: bytes | None, partition: int, offset: int) -> Applied:
        """Decode and apply one record of the steps topic (what workers and replays share).
        Never raises: an event the assembler fails on comes back with a dead-letter reason."""
        try:
            event = steps_topic_adapter.validate_json(value or b"")
        except ValidationError as exc:
            reason = f"undecodable or unknown event: {exc.errors(include_url=False)[:3]}"
            return Applied(None, dead_letter_reason=reason)
        try:
            return self._apply(event, partition, offset)
        except Exception as exc:  # a bug must cost one event, not the partition
            log.exception("assembler failed on %s@%d", event.type, offset)
            self.counters["assembler_errors"] += 1
            return Applied(event, dead_letter_reason=f"assembler error: {exc!r}")

    def _apply(self, event: StepsEvent, partition: int, offset: int) -> Applied:
        if isinstance(event, StepRecorded):
            outcome = self.add_step(event, partition, offset)
            applied = Applied(
                event, outcome.segments, outcome.dead_letter_reason, outcome.skipped_reason
            )
        elif isinstance(event, SessionFinalized):
            self._seen(event.session_id, offset)
            if event.session_id in self._finalized:
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
            if event.session_id not in self._sessions and event.session_id not in self._finalized:
                self._sessions[event.session_id] = _Session(
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
        if event.session_id in self._finalized:
            self._seen(event.session_id, offset)
            return self._ended_again(event)
        session = self._sessions.get(event.session_id)
        if session is None:  # discarded before any step: still closed, still announced
            session = _Session(None, partition, offset, offset, last_event_time=event.event_time)
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
        ended = self._finalized[event.session_id]
        how = "finalized" if isinstance(event, SessionFinalized) else "discarded"
        if (how, event.event_time) == (ended.how, ended.at):
            self.counters["repeated_ends"] += 1
            return Applied(event, skipped_reason="the session's end, sent again")
        self.counters["ends_after_end"] += 1
        when = datetime.datetime.fromtimestamp(ended.at, datetime.UTC).isoformat()
        return Applied(event, dead_letter_reason=f"session already ended ({ended.how} at {when})")

    def _seen(self, session_id: str, offset: int) -> None:
        """Stretch the offset span of the session an event belongs to, open or closed."""
        session = self._sessions.get(session_id)
        if session is not None:
            session.last_offset = max(session.last_offset, offset)
            return
        ended = self._finalized.get(session_id)
        partition = ended.partition if ended is not None else None
        span = (
            self._closed_spans.get(partition, {}).get(session_id) if partition is not None else None
        )
        if partition is not None and span is not None:
            self._closed_spans[partition][session_id] = (span[0], max(span[1], offset))

    def add_step(self, step: StepRecorded, partition: int, offset: int) -> StepOutcome:
        self._seen(step.session_id, offset)
        session = self._sessions.get(step.session_id)
        if session is None:
            if step.session_id in self._finalized:
                self.counters["late_steps"] += 1
                return StepOutcome(dead_letter_reason="step for a session already finalized")
            if step.prefix == "tito":
                # Its parent sits below this worker's start offset, so the session was complete
                # when the offset was committed: this is a replayed event already assembled.
                self.counters["replayed_orphan_steps"] += 1
                return StepOutcome(skipped_reason="parent step precedes the committed offset")
            session = _Session(step.instance_id, partition, offset, offset)
            self._sessions[step.session_id] = session
        malformed = _malformed(step)
        if malformed:
            self.counters["malformed_steps"] += 1
            return StepOutcome(dead_letter_reason=f"malformed step: {malformed}")
        sampled = _Sampled.of(step)
        digest = sampled.digest
        known = session.digests.get(step.step_id)
        if known is not None:
            if known == digest:  # the producer's re-send, or a redelivery
                self.counters["duplicate_steps"] += 1
                return StepOutcome(skipped_reason="duplicate step id")
            self.counters["conflicting_steps"] += 1
            return StepOutcome(dead_letter_reason="step id already used by another step")
        session.instance_id = session.instance_id or step.instance_id
        session.last_event_time = step.event_time
        placed = self._place(session, step, sampled.tail)
        if isinstance(placed, str):
            self.counters[placed] += 1
            # A segment without its prefix would be a wrong sample; keep the event for replay.
            return StepOutcome(dead_letter_reason=placed)
        segment, context, anchor = placed
        if step.tool_parse_error:
            session.diagnostics["tool_parse_errors"] += 1
        segment.extend(step, context, sampled)
        session.segment_of_step[step.step_id] = segment
        session.digests[step.step_id] = digest
        context_digest = sampled.tail_digest if context is sampled.tail else _hash(context)
        prompt_key = _hash(session.full_keys.get(anchor or "", b"") + context_digest)
        session.full_keys[step.step_id] = _hash(prompt_key + sampled.completion_digest)
        session.samples.setdefault(prompt_key, []).append(step.step_id)
        if anchor is not None:
            session.continued.add(anchor)
        if 0 < self.max_segment_tokens <= len(segment.tokens) - segment.carried:
            return StepOutcome(segments=[self._emit_at_size(step.session_id, session, segment)])
        return StepOutcome()

    def _emit_at_size(
        self, session_id: str, session: _Session, segment: _Segment
    ) -> SegmentFinalized:
        following = segment.as_context()
        _replace(session, segment, following)
        return self._emit(session_id, session, segment, "size")

    def _place(
        self, session: _Session, step: StepRecorded, tail: array[int]
    ) -> tuple[_Segment, array[int], str | None] | str:
        """The segment this step extends, the context tokens it adds there and the step it
        follows (its anchor), or why it cannot be placed."""
        if step.prefix == "tito":
            parent = session.segment_of_step.get(step.parent_step_id or "")
            if parent is None:
                return "unknown_parent_step"
            index = parent.index_of(step.parent_step_id or "")
            if index is None or parent.steps[index].completion_end != step.prefix_len:
                return "prefix_length_mismatch"
            return self._after(session, parent, index), tail, step.parent_step_id
        prompt = tail  # rendered: the whole prompt
        found = self._latest_prefix(session, prompt)
        if isinstance(found, tuple):
            segment, index = found
            session.diagnostics["cache_miss"] += 1
            self.counters["divergence_cache_miss"] += 1
            end = segment.steps[index].completion_end
            return self._after(session, segment, index), prompt[end:], segment.steps[index].step_id
        if found:  # the prompt of a segment's first step, sampled again: a branch of its own
            session.diagnostics["forks"] += 1
            segment = _Segment(chain_id=step.chain_id, split_reason="fork")
            session.segments.append(segment)
            return segment, prompt, None
        reason = self._classify(session.segments[-1], step) if session.segments else None
        if reason:
            session.diagnostics[reason] += 1
            self.counters[f"divergence_{reason}"] += 1
            if self.recompute:
                rebuilt = self._rebuild_for(session.segments[-1], step)
                session.diagnostics["rebuilt" if rebuilt else "rebuild_fallback"] += 1
                if rebuilt is not None:
                    _replace(session, session.segments[-1], rebuilt)
                    return rebuilt, array("i"), None
        segment = _Segment(chain_id=step.chain_id, split_reason=reason)
        session.segments.append(segment)
        return segment, prompt, None

    def _after(self, session: _Session, segment: _Segment, index: int) -> _Segment:
        """Where a step following ``segment``'s step ``index`` goes: that segment if the step is
        its last, else a new branch."""
        if index == len(segment.steps) - 1:
            return segment
        fork = segment.fork_at(index)
        session.segments.append(fork)
        session.diagnostics["forks"] += 1
        return fork

    @staticmethod
    def _latest_prefix(session: _Session, prompt: array[int]) -> tuple[_Segment, int] | bool:
        """The segment and step after whose completion the rendered ``prompt`` goes on (the
        longest such prefix; on a tie, a segment's last step, then the earliest segment); else
        whether the prompt is exactly the first prompt of a segment."""
        wanted = np.frombuffer(prompt, dtype=np.int32)
        best: tuple[_Segment, int] | None = None
        best_end, first_prompt = -1, False
        for segment in session.segments:
            if not segment.steps:
                continue
            held = np.frombuffer(segment.tokens, dtype=np.int32)
            n = min(len(held), len(wanted))
            differ = np.flatnonzero(held[:n] != wanted[:n])
            common = int(differ[0]) if differ.size else n
            first = segment.steps[0]
            if first.prompt_start == 0 and first.completion_start == len(wanted) <= common:
                first_prompt = True
            for index in range(len(segment.steps) - 1, -1, -1):
                end = segment.steps[index].completion_end
                if end <= common and end < len(wanted):
                    head = index == len(segment.steps) - 1
                    best_is_head = best is not None and best[1] == len(best[0].steps) - 1
                    if end > best_end or (end == best_end and head and not best_is_head):
                        best, best_end = (segment, index), end
                    break
        return best if best is not None else first_prompt

    def _classify(self, segment: _Segment, step: StepRecorded) -> str:
        """Why a fully rendered prompt does not continue the session's latest segment."""
        if step.tools_hash != segment.tools_hash:
            return "tool_change"
        conversation = [_message_key(m) for m in step.new_messages]
        if conversation[: len(segment.messages)] != [t.key for t in segment.messages]:
            return "history_rewrite"  # edited, compacted, or injected into (Claude Code reminders)
        # The same conversation, other tokens: the template renders history differently from
        # what was sampled. Where the ids part, same text means a retokenization.
        prompt = step.prompt_tail_ids
        tokens = segment.tokens.tolist()
        at = next(i for i, (a, b) in enumerate(zip(tokens, prompt, strict=False)) if a != b)
        span = next((s for s in segment.steps if s.completion_start <= at < s.completion_end), None)
        if span is None or self.decode is None:
            return "template"
        sampled = self.decode(tokens[span.completion_start : span.completion_end])
        rendered = self.decode(prompt[span.completion_start :])
        return "retokenization" if rendered.startswith(sampled) else "template"

    def _rebuild_for(self, segment: _Segment, step: StepRecorded) -> _Segment | None:
        """``segment`` rebuilt on ``step``'s rendered prompt, if that prompt still holds every
        turn the segment generated (in order) and nothing of it was emitted already."""
        if segment.carried:
            return None
        generated = [t for t in segment.messages if t.step_id]
        turns: list[_Turn] = []
        for message in step.new_messages:
            found = bool(generated) and message.get("role") == "assistant"
            if found and _message_key(message) == generated[0].key:
                turns.append(_Turn(message, generated.pop(0).step_id))
            else:
                turns.append(_Turn(message))
        if generated:
            return None  # turns were dropped (compaction): keep them in their own segment
        return self._relabelled(segment, turns, step.prompt_tail_ids)

    def _relabelled(
        self, segment: _Segment, turns: list[_Turn], tokens: list[int]
    ) -> _Segment | None:
        """A segment of ``tokens`` (a render of ``turns``) whose generated turns are
        ``segment``'s steps, labelled by :func:`workers.rebuild.relabel`; None when the
        template's assistant turns cannot be found in ``tokens``."""
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
        rebuilt = _Segment(
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

    def _emit(
        self,
        session_id: str,
        session: _Session,
        segment: _Segment,
        reason: FinalizeReason,
        last: bool = False,
        unused: bool = False,
    ) -> SegmentFinalized:
        """The segment as its session's build mode makes it (tokens with logprob source 3 wait
        for the recompute stage: see :func:`needs_recompute`)."""
        mode = session.build_mode or self.build_mode
        built: _Segment | None = segment
        if mode == "last-step":
            built = self._last_step(segment)
            if built is None:
                session.diagnostics["rebuild_fallback"] += 1
        mask = self.mask_stale_versions
        if built is None or mode == "concat":
            built, mode = segment, "concat"
        return _segment_event(session_id, session, built, reason, mode, last, mask, unused)

    def _last_step(self, segment: _Segment) -> _Segment | None:
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
        return self._relabelled(segment, segment.messages, tokens)

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
        session = self._close(session_id, reason, time.time() if at is None else at)
        if session is None:
            self.counters["finalize_unknown_session"] += 1
            return Closed()
        session.metadata.update(metadata or {})
        session.reward = reward
        session.reward_components = dict(reward_components or {})
        used, unused = self._layout(session)
        kept = [*unused, *used]  # the last of session is a used one: readers may skip the rest
        segments = [
            self._emit(
                session_id, session, segment, reason, segment is kept[-1], index < len(unused)
            )
            for index, segment in enumerate(kept)
        ]
        if segments:
            return Closed(segments)
        notice = SessionDiscarded(
            session_id=session_id,
            event_time=session.last_event_time,
            reason="empty",
            instance_id=session.instance_id,
            channel=session.channel,
            metadata=session.metadata,
        )
        return Closed(notice=notice)

    def _layout(self, session: _Session) -> tuple[list[_Segment], list[_Segment]]:
        """The session's segments with a trainable token, split into those the client followed
        and those whose only trainable tokens are an unused sample (its ancestors, if trainable
        there, stay in a segment of their own: the branch that continued them holds them as
        context)."""
        unused_steps = _unused_samples(session)
        used: list[_Segment] = []
        unused: list[_Segment] = []
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
                segment = segment.copy("fork")
                segment.make_context(head.prompt_start)
            unused.append(segment)
        return used, unused

    def _close(self, session_id: str, how: str, at: float) -> _Session | None:
        """Take a session out of the open ones, leaving a tombstone (late steps are late)."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            return None
        self._finalized[session_id] = _Ended(session.partition, how, at)
        while len(self._finalized) > MAX_TOMBSTONES:
            self._finalized.popitem(last=False)
        spans = self._closed_spans.setdefault(session.partition, {})
        spans[session_id] = (session.first_offset, session.last_offset)
        return session

    def drop_partitions(self, partitions: set[int]) -> list[str]:
        """Forget (and return) sessions of partitions this worker no longer owns; whoever owns
        them next re-reads them from the committed offset, finalized ones included."""
        dropped = [s for s, v in self._sessions.items() if v.partition in partitions]
        for session_id in dropped:
            del self._sessions[session_id]
        for session_id in [s for s, e in self._finalized.items() if e.partition in partitions]:
            del self._finalized[session_id]
        for partition in partitions:
            self._closed_spans.pop(partition, None)
        return dropped

    def commit_offset(self, partition: int, next_offset: int) -> int:
        """The offset a consumer may commit for ``partition`` after reading up to ``next_offset``.

        It never falls inside a session: no session, open or finalized, has events both below
        and at or above it. A worker that restarts there therefore reads every session it meets
        from its first event, and rebuilds byte-identical segments (dropped downstream as
        duplicates) — never a tail of a finished session dressed as a new one.
        """
        spans = [
            (s.first_offset, float("inf"))
            for s in self._sessions.values()
            if s.partition == partition
        ]
        closed = self._closed_spans.get(partition, {})
        spans += [(first, float(last)) for first, last in closed.values()]
        commit, moved = next_offset, True
        while moved:
            straddling = [first for first, last in spans if first < commit <= last]
            moved = bool(straddling)
            commit = min(straddling, default=commit)
        for session_id in [s for s, (_, last) in closed.items() if last < commit]:
            del closed[session_id]  # wholly below the commit point: it can never straddle it
        return commit


def _malformed(step: StepRecorded) -> str | None:
    """What makes a step event unusable, whatever the session holds (None: nothing)."""
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


def _hash(data: bytes | array[Any], more: array[Any] | None = None) -> bytes:
    """16 bytes of blake2b: chained over token runs, equal keys mean equal token sequences."""
    digest = hashlib.blake2b(data, digest_size=16)
    if more is not None:
        digest.update(more)
    return digest.digest()


def _unused_samples(session: _Session) -> set[str]:
    """Samples of one prompt that nobody continued while a sibling was continued; when none
    was, all but the latest (a client's retries: it kept the last answer)."""
    unused: set[str] = set()
    for samples in session.samples.values():
        if len(samples) < 2:
            continue
        leaves = [s for s in samples if s not in session.continued]
        unused.update(leaves if len(leaves) < len(samples) else leaves[:-1])
    return unused


def pending_positions(segment: SegmentFinalized) -> list[int]:
    """Positions whose logprobs the recompute stage has yet to fill in (source 3, NaN)."""
    return [
        p
        for p, (source, logprob) in enumerate(
            zip(segment.logprob_source, segment.logprobs, strict=True)
        )
        if source == LOGPROB_SOURCE_RECOMPUTED and math.isnan(logprob)
    ]


def needs_recompute(segment: SegmentFinalized) -> bool:
    # The C-level membership test spares almost every segment the per-position scan.
    return LOGPROB_SOURCE_RECOMPUTED in segment.logprob_source and bool(pending_positions(segment))


def _replace(session: _Session, old: _Segment, new: _Segment) -> None:
    """``new`` takes ``old``'s place and its steps; a rebuilt segment becomes the latest."""
    at = session.segments.index(old)
    if new.carried:  # the continuation of a segment emitted at size keeps its place
        session.segments[at] = new
    else:
        del session.segments[at]
        session.segments.append(new)
    for step_id, holder in session.segment_of_step.items():
        if holder is old:
            session.segment_of_step[step_id] = new


def _segment_event(
    session_id: str,
    session: _Session,
    segment: _Segment,
    reason: FinalizeReason,
    build_mode: BuildMode,
    last: bool = False,
    mask_stale: bool = False,
    unused: bool = False,
) -> SegmentFinalized:
    # A step ends at most one segment, so (session, last step) names a segment. A worker that
    # re-reads a finished session from mid-way (its start was below the committed offset)
    # rebuilds a tail of a segment already emitted: same last step, same id, dropped downstream.
    last_step_id = segment.steps[-1].step_id
    segment_id = hashlib.sha256(f"{session_id}\0{last_step_id}".encode()).hexdigest()[:32]
    # Built from values already validated (events) or made here with the right types, so
    # validating again would only re-check every array element (a third of emitting a segment).
    return SegmentFinalized.model_construct(
        session_id=session_id,
        event_time=segment.last_event_time,
        segment_id=segment_id,
        chain_id=segment.chain_id,
        instance_id=session.instance_id,
        rollout_id=str(session.metadata.get("rollout_id") or session_id),
        token_ids=segment.tokens.tolist(),
        loss_mask=mask_stale_versions(segment.loss_mask.tolist(), segment.versions)
        if mask_stale
        else segment.loss_mask.tolist(),
        logprobs=segment.logprobs.tolist(),
        logprob_source=segment.source.tolist(),
        weight_versions=list(segment.versions),
        routed_experts=segment.routing.block(),
        steps=list(segment.steps),
        finalize_reason=reason,
        split_reason=segment.split_reason,
        build_mode=build_mode,
        diagnostics=dict(sorted(session.diagnostics.items())),
        metadata=dict(session.metadata),
        channel=session.channel,
        reward=session.reward,
        reward_components=dict(session.reward_components),
        last_of_session=last,
        unused_sample=unused,
    )
