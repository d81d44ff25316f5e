"""The content-addressed image store: the bytes of every recorded image, named by their sha256,
at ``<root>/<sha256[:2]>/<sha256>`` (TITOFLOW_IMAGE_STORE_DIR). The ingress writes to it, the
trainer reads from it (:meth:`ImageStore.get`, ``titoflow.client``); events carry only the names.

Invariants:
- A file of the store holds exactly the bytes its name hashes to: it is written to a temporary
  file in the same directory, flushed to disk, then renamed into place (atomic on one file
  system; the directory flushed too, so the name survives a crash), so a reader sees all of it
  or nothing; :meth:`ImageStore.get` checks the hash again.
- Writing is idempotent: an image already stored is not written again (same name, same bytes).
- An image's mtime is no earlier than the recording of the last step that named it: the
  ingress :meth:`refreshes <ImageStore.refresh>` (or writes) every image a step names before
  it publishes the step. :meth:`ImageStore.prune` deletes only images whose mtime is older than
  its cutoff, read again on the file it deletes after renaming it out of the way: a refresh
  that landed before the rename is seen there and the image put back; one after it finds no
  file, and the ingress writes the image again. So no image that a step published after the
  cutoff names is deleted (docs/operations.md, "The image store", sets the cutoff).
- Nothing here knows a request or an event: plain bytes and names, blocking file I/O (the
  ingress calls it from a worker thread).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from titoflow.errors import ImageStoreUnavailable

IMAGE_MODE = 0o644  # an image file: written by its ingress, read by every trainer


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

    def refresh(self, sha256: str) -> bool:
        """Mark the image named ``sha256`` as named now (its mtime, which :meth:`prune` reads);
        False when the store does not hold it. :class:`~titoflow.errors.ImageStoreUnavailable`
        when it cannot be marked."""
        try:
            os.utime(self.path(sha256))
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise self._unavailable(f"cannot mark image {sha256} named", exc) from exc
        return True

    def put(self, data: bytes, sha256: str | None = None) -> str:
        """Store ``data`` (whose sha256 the caller may already know) unless it is stored, then
        only :meth:`refresh` it; its name. :class:`~titoflow.errors.ImageStoreUnavailable` when
        it cannot be written."""
        name = hashlib.sha256(data).hexdigest()
        if sha256 is not None and sha256 != name:
            raise ValueError(f"the bytes hash to {name}, not {sha256}")
        final = self.path(name)
        if self.refresh(name):
            return name
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=final.parent, prefix=f".{name}.")
            try:
                # mkstemp makes it 0600: trainers reading the shared volume run as other users
                # (other containers); who may reach the store at all is its directory's mode.
                os.fchmod(handle, IMAGE_MODE)
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
            raise self._unavailable(f"cannot take image {name}", exc) from exc
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

    def prune(self, older_than_s: float, dry_run: bool = False, now: float | None = None) -> Pruned:
        """Delete every image whose mtime (when a step last named it: the module's invariant)
        is before ``now - older_than_s`` (``now``: the clock's unless given), and the temporary
        files unfinished writes left that are as old; with ``dry_run``, only count them. One
        prune of a store at a time (a lock file, ``<root>/.prune.lock``): another one raises
        :class:`~titoflow.errors.ImageStoreUnavailable`. Shard directories stay, empty or not:
        a writer may be putting an image in one."""
        cutoff = (time.time() if now is None else now) - older_than_s
        try:
            shards = sorted(s for s in self.root.iterdir() if _is_shard(s))
            if dry_run:
                return _prune(shards, cutoff, remove=False)
            with _lock(self.root / ".prune.lock"):
                return _prune(shards, cutoff, remove=True)
        except OSError as exc:
            raise self._unavailable("cannot be pruned", exc) from exc

    def _unavailable(self, failed: str, exc: OSError) -> ImageStoreUnavailable:
        return ImageStoreUnavailable(
            f"the image store {self.root} {failed}: {exc} (setting TITOFLOW_IMAGE_STORE_DIR)"
        )


@dataclass(frozen=True)
class Pruned:
    """What a prune deleted (or, dry, would delete) and kept: images and their bytes, and the
    temporary files of writes that never finished (a writer killed before its rename)."""

    removed: int = 0
    removed_bytes: int = 0
    kept: int = 0
    kept_bytes: int = 0
    unfinished: int = 0


_HEX = frozenset("0123456789abcdef")
# An image being pruned: renamed out of its name while its mtime is read again. mkstemp's
# temporary names end in 8 random characters, never in this one's 7.
_PRUNING = ".pruning"


def _is_name(name: str) -> bool:
    return len(name) == 64 and _HEX.issuperset(name)


def _is_shard(path: Path) -> bool:
    return len(path.name) == 2 and _HEX.issuperset(path.name) and path.is_dir()


def _prune(shards: list[Path], cutoff: float, remove: bool) -> Pruned:
    removed = removed_bytes = kept = kept_bytes = unfinished = 0
    for shard in shards:
        if remove:
            _put_back(shard)
        # Listed first: removing renames files in the directory being read.
        for entry in list(os.scandir(shard)):
            try:
                found = entry.stat(follow_symlinks=False)
            except FileNotFoundError:  # an unfinished write that finished meanwhile
                continue
            if not stat.S_ISREG(found.st_mode):
                continue
            path = Path(entry.path)
            if _is_name(entry.name) and entry.name.startswith(shard.name):
                if found.st_mtime >= cutoff or (remove and not _remove_unnamed(path, cutoff)):
                    kept += 1
                    kept_bytes += found.st_size
                else:
                    removed += 1
                    removed_bytes += found.st_size
            elif _is_unfinished(entry.name, shard.name) and found.st_mtime < cutoff:
                if remove:
                    path.unlink(missing_ok=True)
                unfinished += 1
    return Pruned(removed, removed_bytes, kept, kept_bytes, unfinished)


def _remove_unnamed(path: Path, cutoff: float) -> bool:
    """Delete the image at ``path`` unless it was named at or after ``cutoff``: whether it was
    deleted. Renamed away first, its mtime read again on the renamed file, which no refresh
    reaches (one finds no file and the ingress writes the image again); named meanwhile, it is
    put back (over a copy the ingress may have written since: the same bytes)."""
    aside = path.with_name(f".{path.name}{_PRUNING}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:  # deleted by someone else meanwhile
        return True
    if _mtime(aside) >= cutoff:
        os.replace(aside, path)
        return False
    aside.unlink()
    return True


def _put_back(shard: Path) -> None:
    """Images a prune that died had renamed aside go back to their names (the lock says no
    prune is running): their mtimes decide again."""
    for entry in os.scandir(shard):
        name = entry.name.removeprefix(".").removesuffix(_PRUNING)
        if entry.name == f".{name}{_PRUNING}" and _is_name(name):
            os.replace(entry.path, os.path.join(shard, name))


def _is_unfinished(name: str, shard: str) -> bool:
    """A temporary file of :meth:`ImageStore.put`: ``.<sha256>.<mkstemp's 8 characters>``."""
    image, _, suffix = name[1:].partition(".")
    return name[:1] == "." and _is_name(image) and image.startswith(shard) and len(suffix) == 8


def _mtime(path: Path) -> float:
    """``path``'s mtime as its file system has it: opened, then stat'ed (NFS revalidates the
    attributes on open, close-to-open consistency; a bare stat may answer from its cache)."""
    handle = os.open(path, os.O_RDONLY)
    try:
        return os.fstat(handle).st_mtime
    finally:
        os.close(handle)


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    """``path`` locked for this process (flock, which NFS emulates with its byte-range locks);
    OSError when another holds it."""
    handle = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OSError(f"another prune holds {path}") from None
        yield
    finally:
        os.close(handle)


def _sync_directory(directory: Path) -> None:
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)
