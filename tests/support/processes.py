"""Finding the processes a test's child started (from /proc, Linux)."""

from __future__ import annotations

from pathlib import Path


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, ppid in parents.items() if ppid == parent]
        found += children
        frontier += children
    return found


def descendant_running(pid: int, *argv: str) -> int:
    """The one process below ``pid`` whose command line holds ``argv`` in a row."""
    found = []
    for child in descendants(pid):
        try:
            words = Path(f"/proc/{child}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if any(words[i : i + len(argv)] == list(argv) for i in range(len(words))):
            found.append(child)
    assert len(found) == 1, (argv, found)
    return found[0]


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
