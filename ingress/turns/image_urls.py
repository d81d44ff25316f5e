"""Images a turn names by http(s) URL, fetched by the ingress before the turn is rendered: the
image's bytes are needed here (their sha256 is the engine's uuid and the record's key, their
upright size fixes the placeholder run), so the ingress reads them itself and sends the engine
a ``data:`` URL, as for an image sent inline.

The ingress fetches from its own network position (docs/operations.md, "Image URLs"):
``image_url_fetch`` turns fetching off, ``image_url_allowed_domains`` limits the hosts fetched
from.

Invariants: a turn leaves :meth:`ImageUrls.read` with every image read (hashed, measured, its
bytes as a ``data:`` URL), or is refused with a 400 (:class:`~titoflow.errors.InvalidRequest`)
naming the URL and the reason, before anything is rendered, sent to the engine or published;
only http and https are fetched, every hop of a redirect is checked against the allowed
domains, at most ``image_url_max_redirects`` redirects are followed, a fetch (body included)
ends within ``image_url_timeout_s``, and no body is read past what the request's image bytes
(``max_image_bytes_per_request``) leave. An image of a turn's new messages (after its last
assistant turn) is fetched on that call, as the API would fetch it, so a URL whose content
changed (a screenshot written to one path every turn) gives the new content; the history re-sent
on every call takes the cached image, the content its turn was rendered with, so it is not
fetched again. (A URL whose content changed after two turns named it gives the history the
newer one: its older turn no longer matches the chain, and the call is rendered in full.)
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable, Iterator
from functools import cache
from operator import attrgetter
from urllib.parse import urlsplit

import certifi
import httpx

from ingress.turns.image_cache import ImageCache
from ingress.turns.service_options import ServiceOptions
from ingress.turns.turn import ChatTurn
from ingress.turns.turn_images import check_images
from titoflow.errors import InvalidRequest
from titoflow.tito.messages import Message, MessageImage
from titoflow.tito.prompt_images import data_url, image_of, is_http_url, is_read

# Fetched images kept per service: a screenshot of turn 3 is re-sent on every later turn.
CACHED_CHARS = 256 << 20


class ImageUrls:
    """The fetching rules of ``options``, for a policy whose image placeholder is ``pad_id``
    (None: it reads no images, so nothing is fetched for it)."""

    def __init__(self, options: ServiceOptions, pad_id: int | None) -> None:
        self.options = options
        self.pad_id = pad_id
        self.cache = ImageCache(CACHED_CHARS)

    async def read(self, turn: ChatTurn) -> ChatTurn:
        """``turn`` with each image still to fetch replaced by the image read from its URL:
        fetched now in the turn's new messages (those after its last assistant turn), as the
        API fetches what it is sent; taken from the cache in the history where held, which
        is what the history was rendered with."""
        # The usual turn, text only, is told by its wire bytes (ingress.wire.known_messages) or one
        # C-level pass; a turn with images, read or not, by one scan of them.
        if (
            turn.text_only
            or not any(map(_IMAGES_OF, turn.messages))
            or next(_unread(turn.messages), None) is None
        ):
            return turn
        fresh_from = max(
            (i + 1 for i, message in enumerate(turn.messages) if message.role == "assistant"),
            default=0,
        )
        history = dict.fromkeys(_unread(turn.messages[:fresh_from]))  # each URL once, in order
        new = dict.fromkeys(_unread(turn.messages[fresh_from:]))
        param = "input" if turn.api == "openai.responses" else "messages"
        if not self.options.image_url_fetch:
            raise _refused(
                next(iter(history or new)),
                "this ingress fetches no image URLs (setting image_url_fetch); send the image as "
                "a data: URL",
                param,
            )
        check_images(self.options, self.pad_id, turn.messages)  # before any fetch
        held = {url: image for url in history if (image := self.cache.get(url)) is not None}
        missing = list(dict.fromkeys([*new, *(url for url in history if url not in held)]))
        fetched: dict[str, MessageImage] = {}
        if missing:
            taken = sum(image.size for image in _images(turn.messages))  # those read already
            budget = _Budget(
                self.options.max_image_bytes, taken + sum(i.size for i in held.values())
            )
            images = await self._fetch_all(missing, budget, param)
            for url, image in zip(missing, images, strict=True):
                self.cache.put(url, image)  # the newest content: what later turns' history holds
                fetched[url] = image
        earlier = held | {url: fetched[url] for url in history if url not in held}
        messages = tuple(
            _with_read(message, earlier if index < fresh_from else fetched)
            for index, message in enumerate(turn.messages)
        )
        return turn.model_copy(update={"messages": messages})

    async def _fetch_all(self, urls: list[str], budget: _Budget, param: str) -> list[MessageImage]:
        """Every URL's image, fetched concurrently; the first refusal cancels the rest."""
        # One deadline per fetch (_fetch's), not httpx's per-operation ones; an identity body,
        # so what the byte budget counts is what arrives (a compressed body would be inflated
        # a whole chunk at a time before it is counted).
        async with httpx.AsyncClient(
            verify=_tls(),
            follow_redirects=False,
            timeout=None,
            headers={"accept-encoding": "identity"},
        ) as client:
            tasks = [asyncio.create_task(self._fetch(client, url, budget, param)) for url in urls]
            try:
                return await asyncio.gather(*tasks)
            finally:  # one refused (or the request was cancelled): the others stop too
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _fetch(
        self, client: httpx.AsyncClient, url: str, budget: _Budget, param: str
    ) -> MessageImage:
        timeout = self.options.image_url_timeout_s
        try:
            async with asyncio.timeout(timeout):
                data, media_type = await self._get(client, url, budget, param)
        except TimeoutError:
            why = f"not fetched within {timeout:g} s (setting image_url_timeout_s)"
            raise _refused(url, why, param) from None
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise _refused(url, f"could not be fetched: {exc!r}", param) from exc
        try:  # off the event loop: measuring a PNG decodes it (milliseconds a screenshot)
            return await asyncio.to_thread(image_of, data, data_url(data, media_type), 0)
        except ValueError as exc:
            raise _refused(url, str(exc), param) from exc

    async def _get(
        self, client: httpx.AsyncClient, url: str, budget: _Budget, param: str
    ) -> tuple[bytes, str]:
        """The body and media type ``url`` answers, following redirects one hop at a time."""
        at = url
        for _ in range(self.options.image_url_max_redirects + 1):
            self._check_host(url, at, param)
            async with client.stream("GET", at) as response:
                if response.next_request is not None:  # a redirect with a Location
                    at = str(response.next_request.url)
                    continue
                if response.status_code != 200:
                    raise _refused(url, f"answered HTTP {response.status_code}", param)
                declared = response.headers.get("content-length", "")
                if declared.isdigit():
                    budget.check(int(declared), url, param)
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    budget.take(len(chunk), url, param)
                    body += chunk
                media_type = response.headers.get("content-type", "").partition(";")[0].strip()
                return bytes(body), (
                    media_type if media_type.startswith("image/") else "application/octet-stream"
                )
        limit = self.options.image_url_max_redirects
        raise _refused(url, f"more than {limit} redirects (setting image_url_max_redirects)", param)

    def _check_host(self, url: str, at: str, param: str) -> None:
        """``at`` (``url`` or where it redirected) is http(s) on an allowed host."""
        hop = "" if at == url else f"redirected to {_shown(at)}, which "
        if not is_http_url(at):
            raise _refused(url, f"{hop or 'it '}is not an http(s) URL", param)
        allowed = self.options.image_url_allowed_domains
        host = (urlsplit(at).hostname or "").lower()
        if allowed and host not in allowed:
            why = f"{hop}names the host {host!r}, not an allowed domain"
            raise _refused(url, f"{why} (setting image_url_allowed_domains)", param)


class _Budget:
    """The image bytes a request may still take, shared by its concurrent fetches."""

    def __init__(self, limit: int, held: int) -> None:
        self.limit = limit
        self.left = limit - held

    def check(self, size: int, url: str, param: str) -> None:
        if size > self.left:
            raise self._too_large(url, param)

    def take(self, size: int, url: str, param: str) -> None:
        self.check(size, url, param)
        self.left -= size

    def _too_large(self, url: str, param: str) -> InvalidRequest:
        why = (
            f"too large: the request's images would exceed {self.limit} bytes "
            "(setting max_image_bytes_per_request)"
        )
        return _refused(url, why, param)


_IMAGES_OF = attrgetter("images")


def _images(messages: Iterable[Message]) -> Iterator[MessageImage]:
    return (image for message in messages for image in message.images)


def _unread(messages: Iterable[Message]) -> Iterator[str]:
    """The URLs of the images of ``messages`` still to fetch."""
    return (image.url for image in _images(messages) if not is_read(image))


def _with_read(message: Message, found: dict[str, MessageImage]) -> Message:
    if all(is_read(image) for image in message.images):
        return message
    images = tuple(
        image if is_read(image) else found[image.url].model_copy(update={"at": image.at})
        for image in message.images
    )
    return message.model_copy(update={"images": images})


def _shown(url: str) -> str:
    return url if len(url) <= 200 else url[:200] + "..."


def _refused(url: str, why: str, param: str) -> InvalidRequest:
    return InvalidRequest(f"the image at {_shown(url)}: {why}", param)


@cache
def _tls() -> ssl.SSLContext:
    """One TLS context for every fetch (building one costs milliseconds), with the CA bundle
    httpx uses by default."""
    return ssl.create_default_context(cafile=certifi.where())
