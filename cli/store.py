"""``titoflow images prune``: the upkeep of the content-addressed image store of
vision-language runs (docs/operations.md, 'The image store').

Invariant: an age that is not one is refused in one line before the store is touched; an age
below the segments' retention is pruned with a warning (a trainer may still need the images)."""

from __future__ import annotations

import argparse
import sys
import time

from cli.flags import add_settings_flags, settings_from
from titoflow.settings import SettingError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    images = sub.add_parser(
        "images",
        help="manage the image store (prune)",
        description="The content-addressed image store of vision-language runs "
        "(TITOFLOW_IMAGE_STORE_DIR): docs/operations.md, 'The image store'.",
    )
    image_actions = images.add_subparsers(dest="action", required=True)
    prune = image_actions.add_parser(
        "prune",
        add_help=False,
        help="delete the images no step named for an age",
        description="Delete every image whose mtime (the last time a step named it: the ingress "
        "refreshes it) is older than --older-than, and print how many and how many bytes. Give "
        "at least the segments topic's retention plus the longest session and trainer lag. One "
        "prune at a time; safe beside running ingress replicas.",
    )
    prune.add_argument(
        "--older-than", required=True, metavar="AGE", help="e.g. 8d, 36h, 90m, 600s, 2w"
    )
    prune.add_argument("--dry-run", action="store_true", help="count, delete nothing")
    add_settings_flags(prune, "images")
    prune.set_defaults(func=cmd_images)


# --older-than's units, in seconds.
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _age_seconds(value: str) -> float | None:
    """``7d``, ``36h``, ``90m``, ``600s``, ``2w`` or bare seconds, in seconds; None when it is
    none of these or not more than 0."""
    number, unit = (value[:-1], value[-1]) if value[-1:] in _AGE_UNITS else (value, "s")
    try:
        seconds = float(number) * _AGE_UNITS[unit]
    except ValueError:
        return None
    return seconds if 0 < seconds < float("inf") else None


def cmd_images(args: argparse.Namespace) -> int:
    from titoflow.errors import ImageStoreUnavailable
    from titoflow.image_store import ImageStore

    settings = settings_from(args)
    age = _age_seconds(args.older_than)
    if age is None:
        print(
            f"titoflow images: --older-than {args.older_than!r}: give an age above 0, a number "
            "with a unit s, m, h, d or w (e.g. 8d)",
            file=sys.stderr,
        )
        return 2
    if not settings.image_store_dir.is_dir():
        raise SettingError(
            "TITOFLOW_IMAGE_STORE_DIR",
            f"{settings.image_store_dir} is no directory: give the ingress' image store",
        )
    retention = settings.segments_retention_s
    if retention < 0 or age < retention:
        kept = "forever" if retention < 0 else f"{retention / 86400:g}d"
        print(
            f"warning: --older-than {args.older_than} is less than the segments' retention "
            f"(TITOFLOW_SEGMENTS_RETENTION_S: {kept}): a retained segment may name an image "
            "this deletes",
            file=sys.stderr,
        )
    now = time.time()
    try:
        pruned = ImageStore(settings.image_store_dir).prune(age, args.dry_run, now)
    except ImageStoreUnavailable as exc:
        print(f"titoflow images: {exc.message}", file=sys.stderr)
        return 1
    moment = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - age))
    print(
        f"{'would remove' if args.dry_run else 'removed'} {pruned.removed} images "
        f"({pruned.removed_bytes:,} bytes) no step named since {moment}; kept {pruned.kept} "
        f"({pruned.kept_bytes:,} bytes)"
        + (f"; {pruned.unfinished} unfinished writes" if pruned.unfinished else "")
    )
    return 0
