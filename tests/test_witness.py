"""The witness check itself (tests/witness.py): it must fail on each way a segment can lie."""

from __future__ import annotations

import struct

import pytest

from schemas.events import SegmentFinalized
from tests.test_assembler import THREE_TURNS, assemble
from tests.witness import Witnessed, WitnessError, check_segments


def calls_of_three_turns() -> list[Witnessed]:
    """What an engine would have witnessed for tests.test_assembler.THREE_TURNS."""
    calls: list[Witnessed] = []
    context: list[int] = []
    for step in THREE_TURNS:
        context = context[: step.prefix_len] + list(step.prompt_tail_ids)
        calls.append(
            Witnessed(
                tuple(context),
                stream=False,
                completion=list(step.completion_ids),
                logprobs=list(step.completion_logprobs),
                finish_reason="stop",
            )
        )
        context += list(step.completion_ids)
    return calls


def tampered(segment: SegmentFinalized, **update: object) -> SegmentFinalized:
    return segment.model_copy(update=update)


def test_an_exact_segment_passes_and_every_lie_fails() -> None:
    [segment] = assemble(THREE_TURNS)
    calls = calls_of_three_turns()
    counts = check_segments([segment], calls, complete=True)
    assert counts["trainable_steps"] == 3 and counts["witnessed_runs"] == 3

    tokens = list(segment.token_ids)
    tokens[4] += 1  # a generated token the engine never sampled
    with pytest.raises(WitnessError, match="not sampled"):
        check_segments([tampered(segment, token_ids=tokens)], calls)
    tokens = list(segment.token_ids)
    tokens[5] += 1  # the context of the second completion is not what the engine saw
    with pytest.raises(WitnessError, match="not sampled"):
        check_segments([tampered(segment, token_ids=tokens)], calls)
    logprobs = list(segment.logprobs)
    (bits,) = struct.unpack("<I", struct.pack("<f", logprobs[3]))
    logprobs[3] = struct.unpack("<f", struct.pack("<I", bits + 1))[0]  # one ulp off
    with pytest.raises(WitnessError, match="logprobs differ"):
        check_segments([tampered(segment, logprobs=logprobs)], calls)
    with pytest.raises(WitnessError, match="more than once"):
        check_segments([segment, tampered(segment, segment_id="copy")], calls)
    mask = list(segment.loss_mask)
    mask[1] = 1  # a prompt token made trainable
    with pytest.raises(WitnessError, match="lie in no witnessed step"):
        check_segments([tampered(segment, loss_mask=mask)], calls)
    extra = Witnessed((9,), stream=True, completion=[8], logprobs=[-1.0], finish_reason="stop")
    with pytest.raises(WitnessError, match="reached no segment"):
        check_segments([segment], [*calls, extra], complete=True)
    check_segments([segment], [*calls, extra], complete=True, accounted=[(9, 8)])
    several = Witnessed((9,), stream=False, completion=[8], finish_reason="stop", samples=4)
    with pytest.raises(WitnessError, match="several samples"):  # 3 of them unrecorded
        check_segments([segment], [*calls, several], accounted=[(9, 8)])
