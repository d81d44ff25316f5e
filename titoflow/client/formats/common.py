"""What several trainer formats read off a segment the same way.

Invariant: the prompt of a segment is everything before its first step's completion (context,
loss mask 0); the response is the rest, generated tokens and the tool results and later turns
between them (whose loss mask is 0), as agent frameworks lay out multi-turn samples. A
segment's images are never dropped silently: a converter carries them or refuses the segment.
Logprobs of another policy than the one a trainer's forward computes are refused, not passed on.
"""

from __future__ import annotations

from collections.abc import Iterable

from schemas.events import SegmentFinalized


def prompt_length(segment: SegmentFinalized) -> int:
    """Tokens before the first generated one (the whole segment if it has no step)."""
    return segment.steps[0].completion_start if segment.steps else len(segment.token_ids)


def truncated(segment: SegmentFinalized) -> bool:
    """The last step stopped at its token limit."""
    return bool(segment.steps) and segment.steps[-1].finish_reason == "length"


def versions(segment: SegmentFinalized) -> list[str]:
    """The weight versions that sampled the segment, in token order, each once."""
    return list(dict.fromkeys(span.version for span in segment.weight_versions))


def refuse_images(segments: Iterable[SegmentFinalized], why: str) -> None:
    """ValueError for the first segment holding images, saying ``why`` they cannot go along."""
    for segment in segments:
        if segment.images:
            raise ValueError(
                f"segment {segment.segment_id} holds {len(segment.images)} images: {why}"
            )


def refuse_other_policies(segment: SegmentFinalized, temperature: float, trainer: str) -> None:
    """ValueError for a step whose recorded logprobs are not ``log_softmax(logits / T)`` with
    the ``trainer``'s temperature and no cut, what its forward computes for the ratio."""
    for step in segment.steps:
        sampled = step.sampling
        if sampled is None:
            continue
        raw = sampled.logprobs_mode == "raw_logprobs" and sampled.temperature != 1.0
        if sampled.cut or raw or sampled.temperature != temperature:
            raise ValueError(
                f"segment {segment.segment_id}, step {step.step_id}: its logprobs "
                f"({sampled.logprobs_mode}, temperature {sampled.temperature}, top_p "
                f"{sampled.top_p}, top_k {sampled.top_k}, min_p {sampled.min_p}) are not "
                f"{trainer}'s log_softmax(logits / {temperature}): sample with no cut at "
                f"{trainer}'s temperature (RolloutClient.open(sampling=...)), with processed "
                "logprobs unless it is 1"
            )
