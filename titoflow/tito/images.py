"""Images of a conversation as the canonical prompt holds them: a ``data:`` URL read into a
:class:`~titoflow.tito.messages.MessageImage` (its bytes' sha256 and upright size), and a
rendered prompt's one placeholder per image expanded to the image's run of placeholder ids.

Invariant: the template writes one placeholder id per image part, in content order, and
:func:`expand` replaces the n-th with the n-th image's run (its length from
titoflow/tito/image_grid.py), so the prompt holds exactly what the engine's processor expands
it to; a prompt whose placeholders do not pair one for one with its images is refused
(``ValueError``), never sent.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from titoflow.tito.image_grid import ImageProcessing, upright_size
from titoflow.tito.messages import MessageImage

IMAGE_PAD = "<|image_pad|>"  # Qwen-VL's placeholder: the one id per image the engine expands


def read_image(url: str, at: int) -> MessageImage:
    """The image of a ``data:`` URL standing at character ``at`` of its message. ValueError
    for any other URL (the ingress fetches nothing) or bytes no image library opens."""
    data = data_url_bytes(url)
    height, width = upright_size(data)
    return MessageImage(
        at=at,
        sha256=hashlib.sha256(data).hexdigest(),
        height=height,
        width=width,
        size=len(data),
        url=url,
    )


def data_url_bytes(url: str) -> bytes:
    """The bytes of a base64 ``data:`` URL; ValueError for any other URL."""
    if not url.startswith("data:"):
        raise ValueError("only data: URLs are taken (base64 image bytes); the ingress fetches none")
    header, comma, payload = url.partition(",")
    if not comma or not header.endswith(";base64"):
        raise ValueError("a data: URL must be base64: data:image/<type>;base64,<bytes>")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"the data: URL is not valid base64: {exc}") from exc


@dataclass(frozen=True)
class Run:
    """An image's placeholder run in an expanded prompt."""

    offset: int
    length: int
    image: MessageImage


def expand(
    ids: Sequence[int],
    images: Sequence[MessageImage],
    processing: ImageProcessing,
    pad_id: int,
    base: int = 0,
) -> tuple[list[int], list[Run]]:
    """``ids`` with the n-th ``pad_id`` replaced by the run of ``images[n]``, and the runs, at
    their offsets in the expanded ids plus ``base`` (where ``ids`` start in the prompt)."""
    count = sum(1 for token in ids if token == pad_id)
    if count != len(images):
        raise ValueError(
            f"the rendered prompt holds {count} image placeholder(s) for {len(images)} image(s)"
            " (a text that spells the placeholder, or a template that drops an image)"
        )
    out: list[int] = []
    runs: list[Run] = []
    pending = iter(images)
    for token in ids:
        if token != pad_id:
            out.append(token)
            continue
        image = next(pending)
        length = processing.tokens(image.height, image.width)
        runs.append(Run(base + len(out), length, image))
        out.extend([pad_id] * length)
    return out, runs
