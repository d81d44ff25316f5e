"""The witness check itself (tests/support/witness.py): it must fail on each way a segment can
lie."""

from __future__ import annotations

import base64
import hashlib
import struct
from dataclasses import replace

import pytest

from cli.dev.vl_policy import IMAGE_PAD_ID
from schemas.events import SegmentFinalized
from schemas.images import ImageRecord
from tests.support.factories import THREE_TURNS, assemble
from tests.support.factories import recorded_step as step
from tests.support.witness import Witnessed, WitnessedImage, WitnessError, check_segments
from titoflow.tito.image_grid import ImageProcessing


def calls_of_three_turns() -> list[Witnessed]:
    """What an engine would have witnessed for tests.workers.test_assembler.THREE_TURNS."""
    calls: list[Witnessed] = []
    context: list[int] = []
    for turn in THREE_TURNS:
        context = context[: turn.prefix_len] + list(turn.prompt_tail_ids)
        calls.append(
            Witnessed(
                tuple(context),
                stream=False,
                completion=list(turn.completion_ids),
                logprobs=list(turn.completion_logprobs),
                finish_reason="stop",
            )
        )
        context += list(turn.completion_ids)
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


# Two turns with images: an image of 4 placeholders in the first prompt, one of 3 in the second
# (the first image sent again by uuid alone).
PAD = IMAGE_PAD_ID
A, B = b"screenshot one", b"screenshot two"
SHA_A, SHA_B = hashlib.sha256(A).hexdigest(), hashlib.sha256(B).hexdigest()


def record(sha256: str, offset: int, length: int) -> ImageRecord:
    """An image record; its grid and processor are not what the witness holds it to."""
    processing = ImageProcessing(patch_size=16, merge_size=2, min_pixels=1024, max_pixels=65536)
    return ImageRecord(
        sha256=sha256,
        offset=offset,
        length=length,
        grid_thw=(1, 2, 2 * length),
        processor=processing.fingerprint("5.19.0"),
    )


IMAGE_TURNS = [
    step("a", [1, *[PAD] * 4, 2], [10, 11], images=[record(SHA_A, 1, 4)]),
    step(
        "b",
        [3, *[PAD] * 3, 4],
        [12],
        parent="a",
        prefix_len=8,
        images=[record(SHA_A, 1, 4), record(SHA_B, 9, 3)],
    ),
]


def with_bytes(data: bytes, uuid: str | None = None) -> WitnessedImage:
    """As the proxy records a ``content_parts`` entry carrying ``data`` in a ``data:`` URL."""
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    return WitnessedImage.of_part({"url": url, "uuid": uuid or hashlib.sha256(data).hexdigest()})


def image_calls() -> list[Witnessed]:
    """What the engine witnessed for IMAGE_TURNS: one placeholder per image sent, the images
    beside (the first one by uuid alone on the second call), each run expanded once."""
    first = (1, *[PAD] * 4, 2)
    second = (*first, 10, 11, 3, *[PAD] * 3, 4)
    return [
        Witnessed(
            (1, PAD, 2),
            stream=True,
            completion=[10, 11],
            logprobs=[-0.5, -1.0],
            finish_reason="stop",
            images=[with_bytes(A)],
            expanded=first,
            placeholders=[(1, 4)],
        ),
        Witnessed(
            (1, PAD, 2, 10, 11, 3, PAD, 4),
            stream=False,
            completion=[12],
            logprobs=[-0.5],
            finish_reason="stop",
            images=[WitnessedImage.of_part({"url": None, "uuid": SHA_A}), with_bytes(B)],
            expanded=second,
            placeholders=[(1, 4), (9, 3)],
        ),
    ]


def test_segments_with_images_are_held_to_the_expanded_prompt_and_every_lie_fails() -> None:
    [segment] = assemble(IMAGE_TURNS)
    calls = image_calls()
    counts = check_segments([segment], calls, complete=True)
    assert counts["trainable_steps"] == 2 and counts["expanded_calls"] == 2
    assert (counts["images_with_bytes"], counts["images_by_uuid"]) == (2, 1)

    def fails(says: str, *changed: Witnessed, on: SegmentFinalized = segment) -> None:
        with pytest.raises(WitnessError, match=says):
            check_segments([on], list(changed), complete=True)

    first, second = calls
    # The segment holds what the engine was sent, not the prompt the model saw.
    [collapsed] = assemble(
        [step("a", [1, PAD, 2], [10, 11]), step("b", [3, PAD, 4], [12], parent="a", prefix_len=5)]
    )
    fails("not sampled", *calls, on=collapsed)
    # An image whose uuid is not the hash of its bytes (an engine cache would answer another's).
    fails("not the sha256", replace(first, images=[with_bytes(A, uuid=SHA_B)]), second)
    fails("no data: URL", replace(first, images=[WitnessedImage(SHA_A, None)]), second)
    # By uuid alone with no earlier call carrying its bytes: to no engine, or to another one.
    fails("never with its bytes", second)
    fails("never with its bytes", first, replace(second, engine="http://other"))
    # The engine's runs: missing, one too many, off by one, not a placeholder run.
    fails("no expanded prompt", replace(first, expanded=None, placeholders=None), second)
    fails("2 placeholder runs", replace(first, placeholders=[(1, 2), (3, 2)]), second)
    fails("cut back", replace(first, placeholders=[(1, 3)]), second)
    fails("not one id repeated", replace(first, placeholders=[(0, 4)]), second)
    # A double expansion: the run sent already expanded, and expanded again by the engine.
    again = (1, *[PAD] * 7, 2)
    sent = replace(first, prompt=(1, *[PAD] * 4, 2), expanded=again, placeholders=[(1, 7)])
    fails("expanded twice", sent, second)
    fails("changed a prompt without images", replace(first, images=[], placeholders=[]), second)


def test_a_segment_s_image_records_are_the_runs_the_engine_placed() -> None:
    [segment] = assemble(IMAGE_TURNS)
    calls = image_calls()
    records = [record(SHA_A, 1, 4), record(SHA_B, 9, 3)]
    assert segment.images == records  # the steps' records, carried by the assembler
    assert check_segments([segment], calls, complete=True)["segment_images"] == 2
    for wrong in (
        [records[0]],  # an image unrecorded
        [records[0], record(SHA_A, 9, 3)],  # another image's bytes
        [records[0], record(SHA_B, 8, 3)],  # the run misplaced
        [records[0], record(SHA_B, 9, 4)],
    ):
        with pytest.raises(WitnessError, match="image records"):
            check_segments([segment.model_copy(update={"images": wrong})], calls)
