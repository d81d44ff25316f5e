"""Weight versions in a segment: masking what older weights sampled (partial rollout)."""

from __future__ import annotations

from schemas.events import VersionSpan


def mask_stale_versions(loss_mask: list[int], spans: list[VersionSpan]) -> list[int]:
    """``loss_mask`` with 0 on the tokens of every span whose version is not the segment's
    latest (the version of its last span): a strictly on-policy trainer learns only from what
    the newest weights sampled. Tokens no span covers keep their mask."""
    if not spans:
        return loss_mask
    latest = spans[-1].version
    masked = list(loss_mask)
    for span in spans:
        if span.version != latest:
            masked[span.start : span.end] = [0] * (span.end - span.start)
    return masked
