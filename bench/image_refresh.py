"""What marking an image named costs the ingress (ingress/turns/recording.py): per image,
:meth:`~titoflow.image_store.ImageStore.refresh` (its name checked, one ``os.utime``) beside the
existence check it replaced (``has``, one stat), on ``--images`` stored images of a directory of
the file system to measure; per step, the thread hop that carries them off the event loop.

    .venv/bin/python -m bench.image_refresh [--dir /mnt/images/bench] [--rounds 20]

Prints the best and the median of five timed passes, in µs; the directory is removed after.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from titoflow.image_store import ImageStore


def per_image_us(names: list[str], mark: Callable[[str], object], rounds: int) -> list[float]:
    passes = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(rounds):
            for name in names:
                mark(name)
        passes.append((time.perf_counter() - started) / (rounds * len(names)) * 1e6)
    return passes


async def hop_us(hops: int) -> float:
    started = time.perf_counter()
    for _ in range(hops):
        await asyncio.to_thread(lambda: None)
    return (time.perf_counter() - started) / hops * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, help="where to make the store [default: a temp dir]")
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=20, help="passes over the images, timed")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="titoflow-refresh-", dir=args.dir))
    try:
        store = ImageStore(root)
        names = [store.put(os.urandom(20_000)) for _ in range(args.images)]
        print(f"{args.images} images in {root}; load {os.getloadavg()[0]:.2f}")
        for label, mark in [("refresh (utime)", store.refresh), ("has (stat)", store.has)]:
            passes = per_image_us(names, mark, args.rounds)
            best, median = min(passes), statistics.median(passes)
            print(f"{label:<16} {best:7.2f} µs an image (best), {median:7.2f} (median)")
        hop = min(asyncio.run(hop_us(2000)) for _ in range(3))
        print(f"{'thread hop':<16} {hop:7.1f} µs a step (best of 3 x 2,000)")
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
