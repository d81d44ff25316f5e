"""The view model of ``titoflow inspect``: a segment with its steps decoded into pieces, its
per-token weight versions, a header and per-step metadata, for every renderer alike.

Invariants:
- Nothing the segment carries is dropped: fields the header does not name (rollout id,
  diagnostics, fields newer than this code) are shown as they are, and tokens no step accounts
  for are named in the header (``tokens_outside_steps``).
- Logprob source names come from the schema's ``LOGPROB_SOURCE_*`` constants, so a new source
  shows up by its name.
- A step's logprob statistics count only tokens with a logprob source (a completion carried
  into a later segment as context has none).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import schemas.events as events
from schemas.events import SegmentFinalized, SegmentStep, StepRecorded
from workers.inspect.decode import Piece, TokenDecoder

_NOT_IN_HEADER = {
    "schema_version",
    "type",
    "token_ids",
    "loss_mask",
    "logprobs",
    "logprob_source",
    "steps",
    "weight_versions",
    "finalize_reason",
    "event_time",
}
_KNOWN_STEP_FIELDS = set(SegmentStep.model_fields)


def source_names() -> dict[int, str]:
    """Logprob source codes, from the schema's ``LOGPROB_SOURCE_*`` constants (``none``,
    ``sampled``, ``constrained``, and ``recomputed`` once the schema defines it)."""
    prefix = "LOGPROB_SOURCE_"
    return {
        value: name.removeprefix(prefix).lower()
        for name, value in vars(events).items()
        if name.startswith(prefix) and isinstance(value, int)
    }


def source_name(code: int) -> str:
    return source_names().get(code, f"source-{code}")


@dataclass
class StepView:
    index: int
    step: SegmentStep
    context: list[Piece]
    completion: list[Piece]
    metadata: dict[str, Any]


@dataclass
class SegmentView:
    segment: SegmentFinalized
    steps: list[StepView]
    versions: list[str | None]  # per token
    header: dict[str, Any]
    still_open: bool = False

    def version_names(self) -> list[str]:
        return list(dict.fromkeys(v for v in self.versions if v is not None))


@dataclass
class Loaded:
    """A segment as read, with its raw JSON (fields this schema version does not know yet)."""

    segment: SegmentFinalized
    raw: dict[str, Any] = field(default_factory=dict)


def _span_field(span: Any, name: str) -> Any:
    return span.get(name) if isinstance(span, dict) else getattr(span, name)


def _spans_to_tokens(
    versions: list[str | None], spans: Iterable[Any], offset: int, limit: int
) -> None:
    for span in spans:
        start = offset + int(_span_field(span, "start"))
        end = min(offset + int(_span_field(span, "end")), limit)
        for i in range(start, end):
            versions[i] = str(_span_field(span, "version"))


def token_versions(
    loaded: Loaded, step_events: dict[str, StepRecorded] | None = None
) -> list[str | None]:
    """Weight version of each token, when known: spans ``{version, start, end}`` over the
    segment's tokens (``weight_versions`` on the segment), else over each step's completion
    (``weight_versions`` on a segment step, or on its ``step_recorded`` event)."""
    segment = loaded.segment
    n = len(segment.token_ids)
    versions: list[str | None] = [None] * n
    top = loaded.raw.get("weight_versions")
    if isinstance(top, list) and top:
        _spans_to_tokens(versions, top, 0, n)
        return versions
    raw_steps = loaded.raw.get("steps") or []
    for index, step in enumerate(segment.steps):
        raw_step = raw_steps[index] if index < len(raw_steps) else {}
        spans: Any = raw_step.get("weight_versions") if isinstance(raw_step, dict) else None
        if not spans and step_events and step.step_id in step_events:
            spans = step_events[step.step_id].weight_versions
        if spans:
            _spans_to_tokens(versions, spans, step.completion_start, step.completion_end)
    return versions


def _time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")


def _step_metadata(
    segment: SegmentFinalized, step: SegmentStep, raw_step: dict[str, Any], event: Any
) -> dict[str, Any]:
    completion = range(step.completion_start, step.completion_end)
    # Only real logprobs (a completion carried into a later segment as context has none).
    logprobs = [
        segment.logprobs[i]
        for i in completion
        if segment.logprob_source[i] != events.LOGPROB_SOURCE_NONE
    ]
    meta: dict[str, Any] = {
        "step_id": step.step_id,
        "prefix": step.prefix,
        "finish_reason": step.finish_reason,
        "context_tokens": step.completion_start - step.prompt_start,
        "completion_tokens": len(completion),
        "tokens": f"[{step.prompt_start}, {step.completion_start}) + "
        f"[{step.completion_start}, {step.completion_end})",
    }
    if logprobs:
        meta["mean_logprob"] = round(sum(logprobs) / len(logprobs), 4)
        meta["min_logprob"] = round(min(logprobs), 4)
    meta.update({k: v for k, v in raw_step.items() if k not in _KNOWN_STEP_FIELDS})
    if isinstance(event, StepRecorded):
        meta.update(
            {
                "parent_step_id": event.parent_step_id,
                "prefix_len": event.prefix_len,
                "turn_id": event.turn_id,
                "api": event.api,
                "stream": event.stream,
                "matcher": event.matcher,
                "model": event.model,
                "engine_request_id": event.engine_request_id,
                "render_ms": round(event.render_ms, 2),
                "engine_ms": round(event.engine_ms, 2),
                "event_time": _time(event.event_time),
                "new_messages": len(event.new_messages),
            }
        )
        if event.weight_versions:
            meta["weight_versions"] = [s.model_dump() for s in event.weight_versions]
        if event.tool_parse_error:
            meta["tool_parse_error"] = event.tool_parse_error
    return meta


def build_view(
    loaded: Loaded,
    decoder: TokenDecoder,
    step_events: dict[str, StepRecorded] | None = None,
    still_open: bool = False,
) -> SegmentView:
    segment = loaded.segment
    ids = segment.token_ids
    raw_steps = loaded.raw.get("steps") or []
    steps = []
    for index, step in enumerate(segment.steps):
        raw_step = raw_steps[index] if index < len(raw_steps) else {}
        event = (step_events or {}).get(step.step_id)
        steps.append(
            StepView(
                index=index,
                step=step,
                context=decoder.pieces(ids, step.prompt_start, step.completion_start),
                completion=decoder.pieces(ids, step.completion_start, step.completion_end),
                metadata=_step_metadata(segment, step, raw_step, event),
            )
        )
    generated = [lp for lp, m in zip(segment.logprobs, segment.loss_mask, strict=True) if m]
    header: dict[str, Any] = {
        "segment_id": segment.segment_id,
        "session_id": segment.session_id,
        "chain_id": segment.chain_id,
        "instance_id": segment.instance_id,
        "finalize_reason": segment.finalize_reason
        + (" (still open: closed for viewing)" if still_open else ""),
        "split_reason": segment.split_reason,
        "event_time": _time(segment.event_time),
        "tokens": len(ids),
        "generated_tokens": len(generated),
        "steps": len(segment.steps),
    }
    if generated:
        header["mean_generated_logprob"] = round(sum(generated) / len(generated), 4)
    sources = {source_name(c): n for c, n in _counts(segment.logprob_source).items()}
    header["logprob_sources"] = sources
    if segment.metadata:
        header["metadata"] = segment.metadata
    spans = loaded.raw.get("weight_versions")
    if isinstance(spans, list) and spans:
        header["weight_versions"] = ", ".join(
            f"{_span_field(s, 'version')} [{_span_field(s, 'start')}, {_span_field(s, 'end')})"
            for s in spans
        )
    covered = sorted((s.prompt_start, s.completion_end) for s in segment.steps)
    untracked, at = [], 0
    for start, end in [*covered, (len(ids), len(ids))]:
        if start > at:
            untracked.append(f"[{at}, {start})")
        at = max(at, end)
    if untracked:  # tokens no step accounts for: not shown below
        header["tokens_outside_steps"] = ", ".join(untracked)
    # Whatever else the segment carries (rollout id, diagnostics, fields newer than this code).
    header.update(
        {k: v for k, v in loaded.raw.items() if k not in header and k not in _NOT_IN_HEADER}
    )
    return SegmentView(
        segment, steps, token_versions(loaded, step_events), header, still_open=still_open
    )


def _counts(values: Iterable[int]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts
