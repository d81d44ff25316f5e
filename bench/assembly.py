"""The worker's per-step cost in process: ``Assembler.apply`` over encoded TITO steps, without
Kafka, so a change to assembly is measured apart from the broker's noise.

    .venv/bin/python -m bench.assembly [--tokens 1000 16000] [--sessions 50] [--against PATH]

The events are ``bench/pipeline.py``'s (sessions of 8 TITO-chained steps, each adding ``tokens``
tokens, packed as the ingress packs them), encoded first; each round applies all of them to a
fresh assembler and finalizes nothing. Reported: the median over rounds of µs per step. With
``--against`` the same measurement runs, interleaved round by round, on another checkout (e.g.
a git worktree of the previous main) in a child process, and the ratio is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from bench.harness import ROOT, command_line, write_results

STEPS_PER_SESSION = 8


# Run in a child process with the measured checkout first on the path, so both sides import
# their own assembler and events (the other checkout need not have this file).
ROUND = """
import sys, time
from bench.pipeline import session_events
from workers.assembler import Assembler
tokens, sessions, steps = (int(a) for a in sys.argv[1:4])
events = [
    event.model_dump_json().encode()
    for i in range(sessions)
    for event in session_events(f"s{i}", steps, tokens, i)
]
assembler = Assembler()
started = time.perf_counter()
for offset, value in enumerate(events):
    assembler.apply(value, 0, offset)
print((time.perf_counter() - started) / len(events) * 1e6)
"""


def measure_in(checkout: str, tokens: int, sessions: int) -> float:
    """µs per step of one round on ``checkout``'s code."""
    argv = [str(tokens), str(sessions), str(STEPS_PER_SESSION)]
    env = {**os.environ, "PYTHONPATH": checkout}
    out = subprocess.run(
        [sys.executable, "-c", ROUND, *argv], cwd=checkout, env=env, check=True, capture_output=True
    )
    return float(out.stdout.decode().split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, nargs="+", default=[1000, 16000])
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--against", default="", help="another checkout to measure alike")
    parser.add_argument("--name", default="assembly")
    args = parser.parse_args()
    rows = []
    lines = [f"{'tokens/step':>11} {'path':<10} {'us/step p50':>12} {'ratio':>6}"]
    for tokens in args.tokens:
        here: list[float] = []
        there: list[float] = []
        for _ in range(args.rounds):
            here.append(measure_in(str(ROOT), tokens, args.sessions))
            if args.against:
                there.append(measure_in(args.against, tokens, args.sessions))
        row = {"tokens": tokens, "us_per_step": round(statistics.median(here), 1)}
        lines.append(f"{tokens:>11} {'this':<10} {row['us_per_step']:>12}")
        if there:
            row["against_us_per_step"] = round(statistics.median(there), 1)
            row["ratio"] = round(row["us_per_step"] / row["against_us_per_step"], 3)
            lines.append(
                f"{tokens:>11} {'--against':<10} {row['against_us_per_step']:>12} {row['ratio']:>6}"
            )
        rows.append(row)
    write_results(args.name, command_line(), {"rows": rows}, "\n".join(lines))
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
