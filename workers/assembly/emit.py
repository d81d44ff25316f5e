"""A session's segment as the ``segment_finalized`` event it is emitted as.

Invariants:
- A segment's id is derived from its session and its last step (a step ends at most one
  segment), so a worker that re-reads a session rebuilds the ids it emitted before, and
  consumers drop the repeats.
- The event is a function of the session's events alone (times come from the log), so the
  same events give the same bytes.
- The build mode is the session's own, else the worker's; a ``last-step`` segment that cannot
  be re-rendered stays concat and says so (``rebuild_fallback``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Literal

from schemas.arrays import PackedList
from schemas.events import BuildMode, SegmentFinalized, segment_id_for
from workers.assembly.rebuilt import SegmentRebuilder
from workers.assembly.segment import OpenSegment
from workers.assembly.session import Session
from workers.versions import mask_other_versions, mask_stale_versions

FinalizeReason = Literal["finalized", "idle", "size"]


@dataclass(frozen=True)
class SegmentEmitter:
    """``build_mode``: the worker's; ``mask_stale_versions``: loss mask 0 on tokens of other
    versions than the latest; ``one_version`` (partial rollout off): loss mask 0 on tokens of
    other versions than the session's first, counted in ``counters``. An ingress refuses such a
    step when its chain cache holds the session's first version; a replica the session moved to
    does not know it, and what it let through is masked here, where every step of the session
    arrives in order."""

    build_mode: BuildMode
    rebuilds: SegmentRebuilder
    mask_stale_versions: bool
    one_version: bool
    counters: Counter[str]

    def emit(
        self,
        session_id: str,
        session: Session,
        segment: OpenSegment,
        reason: FinalizeReason,
        last: bool = False,
        unused: bool = False,
    ) -> SegmentFinalized:
        """The segment as its session's build mode makes it (tokens with logprob source 3
        wait for the recompute stage: see :mod:`workers.assembly.pending`)."""
        mode = session.build_mode or self.build_mode
        built = self.rebuilds.last_step(segment) if mode == "last-step" else segment
        if built is None:
            session.diagnostics["rebuild_fallback"] += 1
            built, mode = segment, "concat"
        # A worker that re-reads a finished session from mid-way (its start was below the
        # committed offset) rebuilds a tail of a segment already emitted: same last step, same
        # id, dropped downstream.
        segment_id = segment_id_for(session_id, built.steps[-1].step_id)
        # Lists that keep a copy of their array, which publishing then packs as it is.
        loss_mask: list[int] = PackedList(built.loss_mask[:])
        if self.one_version and session.first_version is not None:
            loss_mask, masked = mask_other_versions(
                loss_mask, built.versions, session.first_version
            )
            self.counters["version_masked_tokens"] += masked
        elif self.mask_stale_versions:
            loss_mask = mask_stale_versions(loss_mask, built.versions)
        # Built from values already validated (events) or made here with the right types, so
        # validating again would only re-check every array element (a third of emitting one).
        return SegmentFinalized.model_construct(
            session_id=session_id,
            event_time=built.last_event_time,
            segment_id=segment_id,
            chain_id=built.chain_id,
            instance_id=session.instance_id,
            rollout_id=str(session.metadata.get("rollout_id") or session_id),
            token_ids=PackedList(built.tokens[:]),
            loss_mask=loss_mask,
            logprobs=PackedList(built.logprobs[:]),
            logprob_source=PackedList(built.source[:]),
            weight_versions=list(built.versions),
            routed_experts=built.routing.block(),
            images=list(built.images),
            steps=list(built.steps),
            finalize_reason=reason,
            split_reason=built.split_reason,
            build_mode=mode,
            diagnostics=dict(sorted(session.diagnostics.items())),
            metadata=dict(session.metadata),
            channel=session.channel,
            reward=session.reward,
            reward_components=dict(session.reward_components),
            last_of_session=last,
            unused_sample=unused,
        )
