"""A session's sample tree: its segments, the segment each step sits in, and which samples
share a prompt.

Invariants:
- Every step sits in exactly one segment, a linear chain of steps. A step that follows a
  segment's last step extends it; one that follows an earlier step opens a branch that holds
  the tokens up to there as context.
- Steps with equal prompt keys were sampled after the same tokens: a key is a chained digest of
  the prompt key and completion of the step it follows and of its own context.
"""

from __future__ import annotations

from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from schemas.events import BuildMode
from schemas.reasons import SplitReason
from workers.assembly.segment import OpenSegment
from workers.assembly.step_tokens import StepTokens, digest


@dataclass
class Session:
    instance_id: str | None
    partition: int
    first_offset: int
    last_offset: int = -1
    metadata: dict[str, Any] = field(default_factory=dict)
    channel: str | None = None
    last_event_time: float = 0.0  # from the log, so a notice about the session is replayable
    reward: float | None = None
    reward_components: dict[str, float] = field(default_factory=dict)
    segments: list[OpenSegment] = field(default_factory=list)
    segment_of_step: dict[str, OpenSegment] = field(default_factory=dict)
    # Per step: a digest of its event (a redelivery matches it), the key of its prompt and of
    # its prompt + completion (a chain of digests: equal keys, equal tokens).
    digests: dict[str, bytes] = field(default_factory=dict)
    full_keys: dict[str, bytes] = field(default_factory=dict)
    samples: dict[bytes, list[str]] = field(default_factory=dict)  # prompt key → its samples
    continued: set[str] = field(default_factory=set)  # steps some later step follows
    diagnostics: Counter[str] = field(default_factory=Counter)
    build_mode: BuildMode | None = None  # SessionOpened's options.build_mode
    # The version that sampled the session's first versioned tokens: with partial rollout off,
    # tokens of any other version are masked (steps a replica could not refuse: see emit).
    first_version: str | None = None

    def start(self, chain_id: str, split_reason: SplitReason | None) -> OpenSegment:
        """A new, empty segment, the session's latest."""
        segment = OpenSegment(chain_id=chain_id, split_reason=split_reason)
        self.segments.append(segment)
        return segment

    def follow(self, segment: OpenSegment, index: int) -> OpenSegment:
        """Where a step following ``segment``'s step ``index`` goes: that segment if the step is
        its last, else a new branch."""
        if index == len(segment.steps) - 1:
            return segment
        fork = segment.fork_at(index)
        self.segments.append(fork)
        self.diagnostics["forks"] += 1
        return fork

    def replace(self, old: OpenSegment, new: OpenSegment) -> None:
        """``new`` takes ``old``'s place and its steps; a rebuilt segment becomes the latest."""
        at = self.segments.index(old)
        if new.carried:  # the continuation of a segment emitted at size keeps its place
            self.segments[at] = new
        else:
            del self.segments[at]
            self.segments.append(new)
        for step_id, holder in self.segment_of_step.items():
            if holder is old:
                self.segment_of_step[step_id] = new

    def record(
        self,
        step_id: str,
        segment: OpenSegment,
        tokens: StepTokens,
        context: array[int],
        anchor: str | None,
    ) -> None:
        """Step ``step_id`` now sits in ``segment``, after step ``anchor`` and ``context``."""
        self.segment_of_step[step_id] = segment
        self.digests[step_id] = tokens.digest
        context_digest = tokens.tail_digest if context is tokens.tail else digest(context)
        prompt_key = digest(self.full_keys.get(anchor or "", b"") + context_digest)
        self.full_keys[step_id] = digest(prompt_key + tokens.completion_digest)
        self.samples.setdefault(prompt_key, []).append(step_id)
        if anchor is not None:
            self.continued.add(anchor)

    def latest_prefix(self, prompt: array[int]) -> tuple[OpenSegment, int] | bool:
        """The segment and step after whose completion the rendered ``prompt`` goes on (the
        longest such prefix; on a tie, a segment's last step, then the earliest segment); else
        whether the prompt is exactly the first prompt of a segment."""
        wanted = np.frombuffer(prompt, dtype=np.int32)
        best: tuple[OpenSegment, int] | None = None
        best_end, first_prompt = -1, False
        for segment in self.segments:
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
