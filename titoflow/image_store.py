"""The content-addressed image store: the bytes of every recorded image, named by their sha256,
at ``<root>/<sha256[:2]>/<sha256>`` (TITOFLOW_IMAGE_STORE_DIR). The ingress writes to it, the
trainer reads from it (:meth:`ImageStore.get`, ``titoflow.client``); events carry only the names.

Invariants:
- A file of the store holds exactly the bytes its name hashes to: it is written to a temporary
  file in the same directory, flushed to disk, then renamed into place (atomic on one file
  system; the directory flushed too, so the name survives a crash), so a reader sees all of it
  or nothing; :meth:`ImageStore.get` checks the hash again.
- Writing is idempotent: an image already stored is not written again (same name, same bytes).
- Nothing here knows a request or an event: plain bytes and names, blocking file I/O (the
  ingress calls it from a worker thread).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from titoflow.errors import ImageStoreUnavailable


@dataclass(frozen=True)
class ImageStore:
    root: Path

    def path(self, sha256: str) -> Path:
        """Where the image named ``sha256`` is stored."""
        if len(sha256) != 64 or not all(c in "0123456789abcdef" for c in sha256):
            raise ValueError(f"{sha256!r} is no sha256 hex digest")
        return self.root / sha256[:2] / sha256

    def has(self, sha256: str) -> bool:
        return self.path(sha256).is_file()

    def put(self, data: bytes, sha256: str | None = None) -> str:
        """Store ``data`` (whose sha256 the caller may already know) unless it is stored; its
        name. :class:`~titoflow.errors.ImageStoreUnavailable` when it cannot be written."""
        name = hashlib.sha256(data).hexdigest()
        if sha256 is not None and sha256 != name:
            raise ValueError(f"the bytes hash to {name}, not {sha256}")
        final = self.path(name)
        if final.is_file():
            return name
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=final.parent, prefix=f".{name}.")
            try:
                with os.fdopen(handle, "wb") as out:
                    out.write(data)
                    out.flush()
                    os.fsync(out.fileno())  # durable before the step naming it is published
                os.replace(temporary, final)
                _sync_directory(final.parent)  # the rename too, before the step is published
            except BaseException:
                Path(temporary).unlink(missing_ok=True)
                raise
        except OSError as exc:
            raise ImageStoreUnavailable(
                f"the image store {self.root} cannot take image {name}: {exc} "
                "(setting TITOFLOW_IMAGE_STORE_DIR)"
            ) from exc
        return name

    def get(self, sha256: str) -> bytes:
        """The bytes of the image named ``sha256``: FileNotFoundError when the store does not
        hold it (another replica's store that is not shared?), ValueError when the file's
        bytes do not hash to its name."""
        data = self.path(sha256).read_bytes()
        found = hashlib.sha256(data).hexdigest()
        if found != sha256:
            raise ValueError(f"the image store's {sha256} holds bytes hashing to {found}")
        return data


def _sync_directory(directory: Path) -> None:
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)
