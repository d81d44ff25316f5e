"""A step's token arrays, converted from its event once, and the digests that name them.

Invariant: equal digests mean equal token sequences. Digests are 16 bytes of blake2b, chained
over token runs, so a prompt's key is built from its parent's key and its own tokens without
hashing the shared history again; every byte of a step is hashed once.
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass
from typing import Any

from schemas.arrays import as_array
from schemas.events import StepRecorded


def digest(data: bytes | array[Any], more: array[Any] | None = None) -> bytes:
    """The digest of ``data`` followed by ``more``."""
    hashed = hashlib.blake2b(data, digest_size=16)
    if more is not None:
        hashed.update(more)
    return hashed.digest()


@dataclass(frozen=True)
class StepTokens:
    """A step's prompt tail, completion and logprobs as packed arrays, and their digests."""

    tail: array[int]
    completion: array[int]
    logprobs: array[float]
    tail_digest: bytes
    completion_digest: bytes
    digest: bytes  # the whole event's content: a redelivery matches it, another step does not

    @classmethod
    def of(cls, step: StepRecorded) -> StepTokens:
        tail = as_array(step.prompt_tail_ids, "i")
        completion = as_array(step.completion_ids, "i")
        logprobs = as_array(step.completion_logprobs, "f")
        tail_digest, completion_digest = digest(tail), digest(completion)
        head = f"{step.parent_step_id}\0{step.prefix}\0{step.prefix_len}\0".encode()
        whole = digest(head + tail_digest + completion_digest, logprobs)
        return cls(tail, completion, logprobs, tail_digest, completion_digest, whole)
