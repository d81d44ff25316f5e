"""A chat turn's images in its prompt: the rendered tail's one placeholder per new image expanded
to the image's run (titoflow/tito/prompt_images.py), and the images the engine call carries
(:class:`~titoflow.engine.api.EngineImage`): those the parent chain already holds by uuid alone
(the engine processed them on an earlier turn; it is sent their URLs again if it lost them),
then the new ones with their bytes.

Invariants: a text-only turn never reaches this module (``PromptBuilder`` checks only the new
messages and the parent's images, so its cost stays the text path's); a turn with images is
refused (:class:`~titoflow.errors.InvalidRequest`, before any engine call or publish) when the
policy reads no images, when it holds more images or image bytes than the settings allow, or
when its placeholders do not pair with its images; the prompt returned holds every image's
expanded run, at the offsets its engine images name.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import replace

from ingress.turns.chains import Chain
from ingress.turns.service_options import ServiceOptions
from titoflow.engine.api import EngineImage
from titoflow.errors import ContextOverflow, InvalidRequest
from titoflow.tito.image_grid import ImageProcessing
from titoflow.tito.messages import Message
from titoflow.tito.prompt_images import expand


def has_images(messages: Sequence[Message]) -> bool:
    return any(message.images for message in messages)


def check_images(
    options: ServiceOptions, pad_id: int | None, messages: Sequence[Message]
) -> tuple[ImageProcessing, int]:
    """How the policy reads the images of ``messages`` (its processing, its placeholder id), or
    the 400 refusing them: the policy reads none, or they are more or larger than the settings
    allow (an image not fetched yet counts no bytes)."""
    processing = options.image_processing
    if processing is None or pad_id is None:
        raise InvalidRequest("the policy reads no images: send text only", "messages")
    every = [image for message in messages for image in message.images]
    if len(every) > options.max_images:
        raise InvalidRequest(
            f"the conversation holds {len(every)} images; at most {options.max_images} are taken "
            "(setting max_images_per_request)",
            "messages",
        )
    size = sum(image.size for image in every)
    if size > options.max_image_bytes:
        raise InvalidRequest(
            f"the conversation's images are {size} bytes; at most {options.max_image_bytes} are "
            "taken (setting max_image_bytes_per_request)",
            "messages",
        )
    return processing, pad_id


def with_images(
    options: ServiceOptions,
    pad_id: int | None,
    messages: Sequence[Message],
    parent: Chain | None,
    covered: int,
    tail: array[int],
) -> tuple[array[int], tuple[EngineImage, ...]]:
    """``tail`` (the prompt past ``parent``'s tokens, rendered from ``messages[covered:]``) with
    its images expanded, and every image of the prompt as the engine takes it."""
    processing, pad = check_images(options, pad_id, messages)
    held = parent.images if parent else ()
    base = len(parent.tokens) if parent else 0
    new = [image for message in messages[covered:] for image in message.images]
    try:
        expanded, runs = expand(tail, new, processing, pad, base)
    except ValueError as exc:
        raise InvalidRequest(str(exc), "messages") from exc
    limit = options.max_model_len
    if base + len(expanded) > limit - 1:
        raise ContextOverflow(
            f"the prompt has {base + len(expanded)} tokens with its images expanded; the model's "
            f"context is {limit} tokens",
            prompt_tokens=base + len(expanded),
            limit=limit,
        )
    sent = tuple(
        EngineImage(
            run.offset,
            run.length,
            run.image.sha256,
            run.image.url,
            grid_thw=processing.grid_thw(run.image.height, run.image.width),
        )
        for run in runs
    )
    return array("i", expanded), (*held, *sent)


def held_images(images: Sequence[EngineImage], tokens: int) -> tuple[EngineImage, ...]:
    """The images of a chain's first ``tokens`` ids, to be sent by uuid alone: the engine
    processed each of them on the call that recorded it."""
    return tuple(replace(image, by_uuid=True) for image in images if image.offset < tokens)
