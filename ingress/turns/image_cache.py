"""Images already read, by the URL they came as: a conversation re-sends its history's images on
every call, and reading one again (decoding a ``data:`` URL's base64, hashing and measuring its
bytes; fetching an http(s) URL) would cost in proportion to the history on every turn.

Invariant: bounded by the characters of the URLs it holds (a URL's, plus the ``data:`` URL an
http(s) URL was read into); least recently used images go first. What it gives back is exactly
what reading the URL gave (the image's ``at`` is the caller's to set): reading is a pure
function of a ``data:`` URL; for an http(s) URL it is the bytes fetched last, which is what the
conversation's latest turn naming it was rendered with.
"""

from __future__ import annotations

from collections import OrderedDict

from titoflow.tito.messages import MessageImage


class ImageCache:
    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self._images: OrderedDict[str, MessageImage] = OrderedDict()
        self._chars = 0

    @property
    def size(self) -> int:
        """Characters of the URLs held."""
        return self._chars

    def get(self, url: str) -> MessageImage | None:
        image = self._images.get(url)
        if image is not None:
            self._images.move_to_end(url)
        return image

    def put(self, url: str, image: MessageImage) -> None:
        """Hold ``image`` as what ``url`` reads to, in place of what it read to before."""
        previous = self._images.pop(url, None)
        if previous is not None:
            self._chars -= _weight(url, previous)
        weight = _weight(url, image)
        if weight > self.max_chars:
            return
        self._images[url] = image
        self._chars += weight
        while self._chars > self.max_chars:
            old_url, old = self._images.popitem(last=False)
            self._chars -= _weight(old_url, old)


def _weight(url: str, image: MessageImage) -> int:
    """A ``data:`` URL is the image's own (one string); an http(s) URL holds the one it was
    read into besides."""
    return len(url) if image.url is url else len(url) + len(image.url)


# Read data: URLs, one per process, shared by the adapters (the Responses API re-sends its whole
# input on every call and has no cache of parsed messages). The strings are mostly the ones the
# session cache's chains hold already, for the engine to be sent again.
DATA_IMAGES = ImageCache(max_chars=256 << 20)
