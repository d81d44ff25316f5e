"""Bytes per token of routed experts on the wire: JSON lists vs titoflow's packed block.

    .venv/bin/python -m bench.routing [--tokens 4000]

For a few MoE shapes (layers x top-k, expert count), random expert ids for ``--tokens`` positions
are encoded as a JSON nested list ``[[[e, ...], ...], ...]`` and as the
:class:`schemas.routed_experts.RoutedExperts` block (narrowest dtype, base64 in JSON). Prints a
table.
"""

from __future__ import annotations

import argparse
import json
import random

from schemas.routed_experts import RoutedExperts

SHAPES = {  # name: (MoE layers, experts per token, experts)
    "tiny-qwen3-moe": (2, 2, 8),
    "Qwen3-30B-A3B": (48, 8, 128),
    "Qwen3-235B-A22B": (94, 8, 128),
    "DeepSeek-V3": (58, 8, 256),
    "1024 experts": (48, 8, 1024),
}


def measure(tokens: int, layers: int, top_k: int, experts: int) -> tuple[float, float]:
    rng = random.Random(0)
    rows = [
        [[rng.randrange(experts) for _ in range(top_k)] for _ in range(layers)]
        for _ in range(tokens)
    ]
    as_json = len(json.dumps(rows, separators=(",", ":")))
    dtype, width = ("uint8", 1) if experts <= 256 else ("uint16", 2)
    flat = [e for row in rows for layer in row for e in layer]
    data = b"".join(e.to_bytes(width, "little") for e in flat)
    block = RoutedExperts(start=0, shape=(tokens, layers, top_k), dtype=dtype, data=data)
    return as_json / tokens, len(block.model_dump_json()) / tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=4000)
    args = parser.parse_args()
    print(f"{'model':<18}{'layers x top-k':>15}{'JSON B/tok':>12}{'packed B/tok':>14}{'ratio':>8}")
    for name, (layers, top_k, experts) in SHAPES.items():
        as_json, packed = measure(args.tokens, layers, top_k, experts)
        shape = f"{layers} x {top_k}"
        print(f"{name:<18}{shape:>15}{as_json:>12.1f}{packed:>14.1f}{as_json / packed:>8.2f}")


if __name__ == "__main__":
    main()
