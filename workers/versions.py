"""Weight versions in a segment: masking what other weights sampled (a strictly on-policy
trainer; partial rollout off).

Invariant: masking only ever turns a loss-mask 1 into 0, on tokens a version span covers; the
tokens, logprobs and spans stay as sampled, so a trainer can still see what was masked and why.
"""

from __future__ import annotations

from schemas.events import VersionSpan


def mask_other_versions(
    loss_mask: list[int], spans: list[VersionSpan], kept: str
) -> tuple[list[int], int]:
    """``loss_mask`` with 0 on the tokens of every span whose version is not ``kept``, and how
    many trained tokens that masked. Tokens no span covers keep their mask."""
    masked = list(loss_mask)
    count = 0
    for span in spans:
        if span.version != kept:
            count += sum(masked[span.start : span.end])
            masked[span.start : span.end] = [0] * (span.end - span.start)
    return masked, count


def mask_stale_versions(loss_mask: list[int], spans: list[VersionSpan]) -> list[int]:
    """``loss_mask`` with 0 on the tokens of every span whose version is not the segment's
    latest (the version of its last span): a strictly on-policy trainer learns only from what
    the newest weights sampled."""
    if not spans:
        return loss_mask
    return mask_other_versions(loss_mask, spans, spans[-1].version)[0]
