"""Bytes and CPU of a segment's token arrays under each candidate wire encoding, side by side.

    .venv/bin/pip install msgpack && .venv/bin/python -m bench.encoding [--tokens 1000 16000]

Segments are built like real ones: Qwen3 vocabulary ids (context tokens skew to frequent ids,
generated ones from the tiny model's near-uniform sampling), float32 logprobs, a uint8 mask and
source. Encodings: the JSON lists a naive schema would use, titoflow's packed little-endian
arrays in base64 inside JSON (what ``schemas.arrays`` does), and msgpack with raw binary arrays.
Prints a table and writes ``bench/results/encoding.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import struct
import time
from array import array
from pathlib import Path
from typing import Any

import msgpack

from schemas.arrays import pack, unpack

VOCAB = 151_669


def segment(n_tokens: int, seed: int) -> dict[str, list[Any]]:
    rng = random.Random(seed)
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    while len(ids) < n_tokens:
        context = rng.randint(20, 400)
        ids += [min(int(rng.paretovariate(1.1) * 50), VOCAB - 1) for _ in range(context)]
        mask += [0] * context
        logprobs += [0.0] * context
        generated = rng.randint(10, 200)
        ids += [rng.randrange(VOCAB) for _ in range(generated)]
        mask += [1] * generated
        # Stored as float32 by the engine: round-trip to get the exact values it reports.
        logprobs += [
            struct.unpack("f", struct.pack("f", rng.uniform(-13, -0.01)))[0]
            for _ in range(generated)
        ]
    return {
        "token_ids": ids[:n_tokens],
        "loss_mask": mask[:n_tokens],
        "logprobs": logprobs[:n_tokens],
        "logprob_source": mask[:n_tokens],
    }


def json_lists(seg: dict[str, list[Any]]) -> bytes:
    return json.dumps(seg).encode()


def json_packed(seg: dict[str, list[Any]]) -> bytes:
    return json.dumps(
        {
            "token_ids": pack(seg["token_ids"], "i"),
            "loss_mask": pack(seg["loss_mask"], "B"),
            "logprobs": pack(seg["logprobs"], "f"),
            "logprob_source": pack(seg["logprob_source"], "B"),
        }
    ).encode()


def msgpack_binary(seg: dict[str, list[Any]]) -> bytes:
    packed: bytes = msgpack.packb(
        {
            "token_ids": array("i", seg["token_ids"]).tobytes(),
            "loss_mask": bytes(seg["loss_mask"]),
            "logprobs": array("f", seg["logprobs"]).tobytes(),
            "logprob_source": bytes(seg["logprob_source"]),
        }
    )
    return packed


def decode_json_lists(data: bytes) -> Any:
    return json.loads(data)


def decode_json_packed(data: bytes) -> Any:
    raw = json.loads(data)
    return {
        "token_ids": unpack(raw["token_ids"], "i"),
        "loss_mask": unpack(raw["loss_mask"], "B"),
        "logprobs": unpack(raw["logprobs"], "f"),
        "logprob_source": unpack(raw["logprob_source"], "B"),
    }


def decode_msgpack(data: bytes) -> Any:
    raw = msgpack.unpackb(data)
    ids, lps = array("i"), array("f")
    ids.frombytes(raw["token_ids"])
    lps.frombytes(raw["logprobs"])
    return {
        "token_ids": ids.tolist(),
        "logprobs": lps.tolist(),
        "loss_mask": list(raw["loss_mask"]),
    }


ENCODINGS = {
    "json lists": (json_lists, decode_json_lists),
    "json + packed base64 (titoflow)": (json_packed, decode_json_packed),
    "msgpack + raw binary": (msgpack_binary, decode_msgpack),
}


def timed(fn: Any, arg: Any, repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn(arg)
    return (time.perf_counter() - start) / repeat * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, nargs="+", default=[1000, 16000])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    rows = []
    for n in args.tokens:
        seg = segment(n, seed=n)
        for name, (encode, decode) in ENCODINGS.items():
            data = encode(seg)
            assert decode(data)["token_ids"] == seg["token_ids"]
            rows.append(
                {
                    "tokens": n,
                    "encoding": name,
                    "bytes_per_token": round(len(data) / n, 2),
                    "encode_ms": round(timed(encode, seg, args.repeat), 3),
                    "decode_ms": round(timed(decode, data, args.repeat), 3),
                }
            )
    print(f"{'tokens':>7} {'encoding':<34} {'bytes/token':>11} {'encode ms':>10} {'decode ms':>10}")
    for row in rows:
        baseline = next(
            r for r in rows if r["tokens"] == row["tokens"] and r["encoding"] == "json lists"
        )
        ratio = row["bytes_per_token"] / baseline["bytes_per_token"]
        print(
            f"{row['tokens']:>7} {row['encoding']:<34} {row['bytes_per_token']:>11} "
            f"{row['encode_ms']:>10} {row['decode_ms']:>10}   ({ratio:.2f}× json bytes)"
        )
    out = Path(__file__).parent / "results" / "encoding.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
