"""Images of a conversation as the canonical prompt holds them: a ``data:`` URL (or bytes
fetched from an http(s) URL) read into a :class:`~titoflow.tito.messages.MessageImage` (its
bytes' sha256 and upright size), and a rendered prompt's one placeholder per image expanded to
the image's run of placeholder ids.

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
from urllib.parse import urlsplit

from titoflow.tito.image_grid import ImageProcessing, upright_size
from titoflow.tito.messages import MessageImage

IMAGE_PAD = "<|image_pad|>"  # Qwen-VL's placeholder: the one id per image the engine expands


def read_image(url: str, at: int) -> MessageImage:
    """The image of a ``data:`` URL standing at character ``at`` of its message. ValueError
    for any other URL or bytes no image library opens."""
    return image_of(data_url_bytes(url), url, at)


def image_of(data: bytes, url: str, at: int) -> MessageImage:
    """The image of encoded bytes ``data`` carried as ``url`` (their ``data:`` URL). ValueError
    when no image library opens them."""
    height, width = upright_size(data)
    return MessageImage(
        at=at,
        sha256=hashlib.sha256(data).hexdigest(),
        height=height,
        width=width,
        size=len(data),
        url=url,
    )


def data_url(data: bytes, media_type: str) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode('ascii')}"


def image_to_fetch(url: str, at: int) -> MessageImage:
    """An image named by an http(s) ``url``, not read yet: no hash, no size, until the ingress
    fetches it (ingress/turns/image_urls.py) and replaces it with :func:`image_of` its bytes."""
    return MessageImage(at=at, sha256="", height=0, width=0, url=url)


def is_http_url(url: str) -> bool:
    """Whether ``url`` is an http or https URL naming a host (the only ones fetched)."""
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unbalanced IPv6 bracket
        return False
    return parts.scheme.lower() in ("http", "https") and bool(parts.hostname)


def is_read(image: MessageImage) -> bool:
    """Whether an image's bytes were read (every image but one of :func:`image_to_fetch`)."""
    return bool(image.sha256)


def data_url_bytes(url: str) -> bytes:
    """The bytes of a base64 ``data:`` URL; ValueError for any other URL."""
    if url[:5].lower() != "data:":
        raise ValueError("not a data: URL")
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
