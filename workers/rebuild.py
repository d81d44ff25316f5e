"""Re-rendered token sequences and which of their tokens keep their sampled logprobs.

Used where a segment's tokens are not (only) the ones its steps sampled: ``last-step`` segments
(the final conversation re-rendered with the chat template) and divergences repaired by
``recompute`` (a rendered step's prompt becomes the segment's tokens). Pure functions over token
arrays; the chat template is the ingress' own :class:`titoflow.tito.render.ChatRenderer`.

Invariant: a token keeps its sampled logprob (and weight version) only inside the longest common
prefix of the new tokens and the tokens the engine actually saw — there its context is identical,
so the sampled logprob is exactly the engine's logprob in the new sequence. Every other trainable
token is marked for recomputation (source 3, logprob NaN until the recompute stage fills it in)
or masked (loss mask 0, source 0): never a silent zero.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from schemas.events import LOGPROB_SOURCE_NONE, LOGPROB_SOURCE_RECOMPUTED, VersionSpan
from titoflow.errors import TemplateError
from titoflow.tito.image_grid import ImageProcessing
from titoflow.tito.messages import Message
from titoflow.tito.prompt_images import IMAGE_PAD, expand
from titoflow.tito.render import ChatRenderer

Span = tuple[int, int]
# The logprob of a token waiting for the recompute stage (source 3): not a number, never a zero.
PENDING = math.nan


class Rebuilder:
    """Renders recorded conversations and finds the assistant turns in token sequences."""

    def __init__(
        self, renderer: ChatRenderer, image_processing: ImageProcessing | None = None
    ) -> None:
        self.renderer = renderer
        # A vision-language policy's: each recorded image (its upright size) becomes its run.
        self.image_processing = image_processing
        self.opening = renderer.assistant_opening()
        self.end_ids = renderer.end_ids
        # What an assistant turn's content follows: the template's opening, and the tokens after
        # which the family starts a turn without one (Mistral's "[/INST]", DeepSeek's end of a
        # tool output).
        starts = [renderer.encode(text) for text in renderer.family.assistant_starts]
        self.openers = [list(o) for o in (self.opening, *starts) if o]

    def render(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]], kwargs: Any
    ) -> list[int]:
        """The whole conversation as the chat template renders it (no generation prompt), each
        image's placeholder expanded to its run; TemplateError where it cannot be."""
        turns = [Message.from_template_dict(m) for m in messages]
        ids = self.renderer.full_prompt(turns, tools, kwargs, add_generation_prompt=False)
        images = [image for turn in turns for image in turn.images]
        if not images:
            return ids
        pad_id = self.renderer.token_id(IMAGE_PAD)
        if self.image_processing is None or pad_id is None:
            raise TemplateError("the conversation holds images and the policy reads none")
        try:
            return expand(ids, images, self.image_processing, pad_id)[0]
        except ValueError as exc:  # placeholders and images do not pair: not this template's
            raise TemplateError(str(exc)) from exc

    def image_runs(self, tokens: Sequence[int]) -> list[tuple[int, int]]:
        """``(offset, length)`` of every run of the image placeholder in ``tokens`` (a template
        encloses each image's run in its own vision markers, so runs never touch)."""
        pad_id = self.renderer.token_id(IMAGE_PAD)
        runs: list[tuple[int, int]] = []
        for at, token in enumerate(tokens):
            if token != pad_id:
                continue
            if runs and sum(runs[-1]) == at:
                runs[-1] = (runs[-1][0], runs[-1][1] + 1)
            else:
                runs.append((at, 1))
        return runs

    def assistant_spans(self, tokens: Sequence[int]) -> list[Span]:
        """``[start, end)`` of every closed assistant turn: its content through the end token
        (what the model generates after the last opener before that end token). An opener with
        no end token after it is a generation prompt, not a turn; a turn that ends with no
        opener since the previous end (a user turn of a template that ends every turn alike)
        is not the model's."""
        spans: list[Span] = []
        begin = 0
        for end, token in enumerate(tokens):
            if token not in self.end_ids:
                continue
            start = self._turn_start(tokens, begin, end)
            if start is not None:
                spans.append((start, end + 1))
            begin = end + 1
        return spans

    def _turn_start(self, tokens: Sequence[int], begin: int, end: int) -> int | None:
        """Where the content after the last opener in ``tokens[begin:end]`` starts."""
        for at in range(end, begin, -1):
            for opener in self.openers:
                n = len(opener)
                if at - n >= begin and list(tokens[at - n : at]) == opener:
                    return at
        return None


@dataclass
class Relabelled:
    """Loss mask, logprobs, sources and versions of a rebuilt token sequence."""

    loss_mask: array[int]
    logprobs: array[float]
    source: array[int]
    versions: list[VersionSpan]
    same: int  # leading tokens equal to the sampled sequence: their context is unchanged


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def relabel(
    sampled_tokens: Sequence[int],
    sampled_mask: Sequence[int],
    sampled_logprobs: Sequence[float],
    sampled_source: Sequence[int],
    sampled_versions: Sequence[VersionSpan],
    tokens: Sequence[int],
    trainable: Sequence[Span],
    recompute: bool,
) -> Relabelled:
    """Labels for ``tokens`` whose ``trainable`` spans are generated turns, given the sampled
    sequence (the tokens the engine saw and made, with their labels)."""
    n = len(tokens)
    same = common_prefix(sampled_tokens, tokens)
    mask = array("B", bytes(n))
    logprobs = array("f", bytes(4 * n))
    source = array("B", bytes(n))
    kept = bytearray(n)
    for start, end in trainable:
        for p in range(start, end):
            if p < same and sampled_mask[p]:
                mask[p], logprobs[p], source[p], kept[p] = (
                    1,
                    sampled_logprobs[p],
                    sampled_source[p],
                    1,
                )
            elif recompute and p > 0:  # position 0 has no prompt logprob
                mask[p], logprobs[p], source[p] = 1, PENDING, LOGPROB_SOURCE_RECOMPUTED
            else:
                source[p] = LOGPROB_SOURCE_NONE
    versions = [
        VersionSpan(version=span.version, start=start, end=end)
        for span in sampled_versions
        for start, end in runs(kept, span.start, min(span.end, same))
    ]
    return Relabelled(mask, logprobs, source, versions, same)


def runs(flags: Sequence[int], start: int, end: int) -> list[Span]:
    """Maximal ``[a, b)`` within ``[start, end)`` where ``flags`` are set."""
    found: list[Span] = []
    run_start: int | None = None
    for p in range(start, max(start, end)):
        if flags[p] and run_start is None:
            run_start = p
        elif not flags[p] and run_start is not None:
            found.append((run_start, p))
            run_start = None
    if run_start is not None:
        found.append((run_start, end))
    return found
