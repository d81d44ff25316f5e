"""Pruning the image store (titoflow/image_store.py) on a real directory with pinned mtimes: a
prune deletes exactly the images whose mtime (the last time a step named them) is older than its
cutoff, keeps the ones named at or after it, counts both, touches nothing that is not an image
of the store, and a refresh that races it (before or after its rename of the image) never costs
the image a published step names. The ingress' side (a step refreshes every image it names) is
tested in tests/workers/test_image_record.py, the command in tests/cli/test_cli.py."""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from titoflow.errors import ImageStoreUnavailable
from titoflow.image_store import ImageStore, Pruned

NOW = 1_700_000_000.0  # the prunes' clock, in the past: whole seconds, so mtimes compare exactly
DAY = 86400.0


def image(n: int) -> bytes:
    return f"image {n}".encode()


def name_at(store: ImageStore, data: bytes, at: float) -> str:
    """What the ingress does for an image a step names (ingress/turns/recording.py), its clock
    pinned at ``at``: refreshed if held, else written."""
    sha256 = hashlib.sha256(data).hexdigest()
    if not store.refresh(sha256):
        store.put(data, sha256)
    os.utime(store.path(sha256), (at, at))
    return sha256


def files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_a_prune_deletes_the_images_not_named_since_its_cutoff_and_keeps_the_others(
    tmp_path: Path,
) -> None:
    store = ImageStore(tmp_path)
    old = [name_at(store, image(n), NOW - 8 * DAY) for n in range(3)]
    edge = name_at(store, image(3), NOW - 7 * DAY)  # named at the cutoff itself: kept
    young = name_at(store, image(4), NOW - 60)
    sizes = {sha: store.path(sha).stat().st_size for sha in [*old, edge, young]}
    # Not images of the store: left alone, whatever their age.
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "zz").mkdir()
    (tmp_path / "zz" / ("a" * 64)).write_text("not a shard")
    (store.path(young).parent / "stray").write_text("not an image")
    for path in [tmp_path / "notes.txt", tmp_path / "zz" / ("a" * 64)]:
        os.utime(path, (0, 0))
    before = files(tmp_path)

    dry = store.prune(7 * DAY, dry_run=True, now=NOW)
    assert files(tmp_path) == before  # counted, nothing deleted, no lock file made
    pruned = store.prune(7 * DAY, now=NOW)
    assert (
        dry
        == pruned
        == Pruned(
            removed=3,
            removed_bytes=sum(sizes[sha] for sha in old),
            kept=2,
            kept_bytes=sizes[edge] + sizes[young],
        )
    )
    assert not any(store.has(sha) for sha in old)
    assert store.get(edge) == image(3) and store.get(young) == image(4)
    assert files(tmp_path) == before - {f"{sha[:2]}/{sha}" for sha in old} | {".prune.lock"}
    # Shard directories stay, emptied or not: a writer may be putting an image in one.
    assert all(store.path(sha).parent.is_dir() for sha in old)
    assert store.prune(7 * DAY, now=NOW) == Pruned(kept=2, kept_bytes=pruned.kept_bytes)


def test_refresh_marks_a_held_image_named_now_and_put_refreshes_what_it_holds(
    tmp_path: Path,
) -> None:
    store = ImageStore(tmp_path)
    assert store.refresh(hashlib.sha256(b"never stored").hexdigest()) is False
    sha = name_at(store, image(0), NOW - 30 * DAY)
    inode = store.path(sha).stat().st_ino
    assert store.refresh(sha) is True
    assert store.path(sha).stat().st_mtime > NOW  # the clock's now, not the pinned past
    os.utime(store.path(sha), (NOW - 30 * DAY, NOW - 30 * DAY))
    assert store.put(image(0)) == sha  # held: not written again, marked named
    after = store.path(sha).stat()
    assert after.st_ino == inode and after.st_mtime > NOW


def test_a_refresh_just_before_the_prune_renames_the_image_keeps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prune read an old mtime, then a step named the image before the prune renamed it
    aside: the prune sees the new mtime on the renamed file and puts the image back."""
    store = ImageStore(tmp_path)
    sha = name_at(store, image(0), NOW - 8 * DAY)
    rename = os.rename

    def refreshed_first(source: str | Path, target: str | Path) -> None:
        name_at(store, image(0), NOW - 1)  # the ingress, between the scan and the rename
        rename(source, target)

    monkeypatch.setattr(os, "rename", refreshed_first)
    assert store.prune(7 * DAY, now=NOW) == Pruned(kept=1, kept_bytes=len(image(0)))
    monkeypatch.undo()
    assert store.get(sha) == image(0) and files(tmp_path) == {f"{sha[:2]}/{sha}", ".prune.lock"}


def test_a_refresh_just_after_the_prune_renamed_the_image_writes_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the image is renamed aside a refresh finds no file, so the ingress writes the
    image again before it publishes its step; the prune deletes only the old file."""
    store = ImageStore(tmp_path)
    sha = name_at(store, image(0), NOW - 8 * DAY)
    rename = os.rename
    raced: list[bool] = []

    def refreshed_after(source: str | Path, target: str | Path) -> None:
        rename(source, target)
        raced.append(store.refresh(sha))
        store.put(image(0), sha)

    monkeypatch.setattr(os, "rename", refreshed_after)
    assert store.prune(7 * DAY, now=NOW).removed == 1
    monkeypatch.undo()
    assert raced == [False]
    assert store.get(sha) == image(0) and files(tmp_path) == {f"{sha[:2]}/{sha}", ".prune.lock"}


def test_a_prune_puts_back_what_a_prune_that_died_had_renamed_aside(tmp_path: Path) -> None:
    store = ImageStore(tmp_path)
    young, old = (name_at(store, image(n), at) for n, at in [(0, NOW), (1, NOW - 8 * DAY)])
    for sha in (young, old):  # the state a prune killed between its rename and its check leaves
        os.rename(store.path(sha), store.path(sha).with_name(f".{sha}.pruning"))
    assert store.prune(7 * DAY, now=NOW) == Pruned(1, len(image(1)), 1, len(image(0)))
    assert store.get(young) == image(0) and files(tmp_path) == {
        f"{young[:2]}/{young}",
        ".prune.lock",
    }


def test_a_prune_removes_old_leftovers_of_unfinished_writes_only(tmp_path: Path) -> None:
    """A writer killed between its temporary file and its rename leaves ``.<sha256>.<8>``;
    a young one may be a write in progress."""
    store = ImageStore(tmp_path)
    sha = hashlib.sha256(b"x").hexdigest()
    shard = tmp_path / sha[:2]
    shard.mkdir()
    for suffix, at in [("abcd1234", NOW - 8 * DAY), ("efgh5678", NOW)]:
        (shard / f".{sha}.{suffix}").write_bytes(b"x")
        os.utime(shard / f".{sha}.{suffix}", (at, at))
    assert store.prune(7 * DAY, dry_run=True, now=NOW).unfinished == 1
    assert files(tmp_path) == {f"{sha[:2]}/.{sha}.abcd1234", f"{sha[:2]}/.{sha}.efgh5678"}
    assert store.prune(7 * DAY, now=NOW) == Pruned(unfinished=1)
    assert files(tmp_path) == {f"{sha[:2]}/.{sha}.efgh5678", ".prune.lock"}


def test_one_prune_at_a_time(tmp_path: Path) -> None:
    store = ImageStore(tmp_path)
    sha = name_at(store, image(0), NOW - 8 * DAY)
    held = os.open(tmp_path / ".prune.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(ImageStoreUnavailable, match="another prune holds"):
            store.prune(7 * DAY, now=NOW)
        assert store.prune(7 * DAY, dry_run=True, now=NOW).removed == 1  # a count needs no lock
    finally:
        os.close(held)
    assert store.has(sha) is True
    assert store.prune(7 * DAY, now=NOW).removed == 1


def test_a_store_that_is_not_there_cannot_be_pruned(tmp_path: Path) -> None:
    with pytest.raises(ImageStoreUnavailable, match="cannot be pruned"):
        ImageStore(tmp_path / "missing").prune(DAY)


# A history: each entry names an image (0-5) at a time, or prunes at a time with an age.
NAMING = st.tuples(st.just("name"), st.integers(0, 5), st.integers(0, 100))
PRUNING = st.tuples(st.just("prune"), st.integers(1, 60), st.integers(0, 100))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(NAMING, PRUNING), max_size=25))
def test_no_image_named_within_the_age_is_pruned_and_every_older_one_is(
    history: list[tuple[str, int, int]],
) -> None:
    """Times in whole seconds after NOW, taken in order (a clock never goes back): after each
    prune, the store holds exactly the images whose last naming is at or after its cutoff, and
    each naming finds its image (held, or written again)."""
    last_named: dict[int, int] = {}  # image -> when a step last named it, while stored
    clock = 0
    with tempfile.TemporaryDirectory() as root:
        store = ImageStore(Path(root))
        for kind, value, step in history:
            clock += step
            if kind == "name":
                name_at(store, image(value), NOW + clock)
                last_named[value] = clock
                continue
            cutoff = clock - value
            kept = {n: at for n, at in last_named.items() if at >= cutoff}
            pruned = store.prune(value, now=NOW + clock)
            assert (pruned.removed, pruned.kept) == (len(last_named) - len(kept), len(kept))
            last_named = kept
            held = {n for n in range(6) if store.has(hashlib.sha256(image(n)).hexdigest())}
            assert held == set(kept)
