"""Images reach the trainer: a segment's recorded images, their bytes in a real image store, become
the vision inputs of a Qwen-VL forward pass (titoflow/client/image_inputs.py) equal to what
transformers' processor, loaded from the tiny VL policy's own preprocessor config, gives for the
original bytes; ``SegmentDataset`` items carry them with each image's run located in the packed
layout; the verl, slime, OpenRLHF and Tinker converters carry them in the fields those
frameworks define, verl's M-RoPE position ids equal to the models' own ``get_rope_index`` and to
verl 0.7.1's agent loop, OpenRLHF's through its own batching and VLM ``Actor`` forward, Tinker's
image chunks equal to tinker-cookbook's datums for the same sessions; and every mismatch between
pixels and recorded tokens raises, naming the image. ``SegmentDataset(..., mrope=True)``'s
``position_ids`` are each segment's ``get_rope_index`` under its text positions, and the tiny
Qwen3-VL policy's forward on a packed item gives each segment the logits it has alone."""

from __future__ import annotations

import hashlib
import io
import itertools
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageOps

from cli.dev.vl_policy import (
    IMAGE_PAD_ID,
    VISION_END_ID,
    VISION_START_ID,
)
from schemas.events import SegmentFinalized
from schemas.images import ImageProcessorFingerprint, ImageRecord
from tests.support.chat_images import PROCESSING
from tests.support.doc_blocks import blocks_run_by
from tests.support.factories import filled_segment, step_segment
from tests.support.format_definitions import DEFINED, Status, conforms
from tests.support.image_items import (
    FINGERPRINT,
    bound,
    check_item_images,
    check_item_positions,
    qwen3_vl_rope_index,
)
from tests.support.image_samples import png, reference_inputs, runs
from tests.support.packed_items import PAD
from tests.support.trainer_rollouts import trainer_step
from titoflow.client.formats.openrlhf import to_openrlhf
from titoflow.client.formats.slime import to_slime
from titoflow.client.formats.tinker import to_tinker, to_tinker_batch
from titoflow.client.formats.verl import to_verl
from titoflow.client.image_inputs import ImageMismatch, image_inputs
from titoflow.client.image_processor import processor_for
from titoflow.client.mrope import mrope_position_ids
from titoflow.client.torch_data import SegmentDataset, block_causal_mask
from titoflow.image_store import ImageStore


def jpeg_sideways(width: int, height: int) -> bytes:
    """A JPEG stored ``width`` x ``height`` whose EXIF says to turn it a quarter (upright it is
    ``height`` wide)."""
    pixels = np.random.default_rng(7).integers(0, 256, (height, width, 3), dtype=np.uint8)
    exif = Image.Exif()
    exif[0x0112] = 6
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", exif=exif.tobytes())
    return out.getvalue()


# Several sizes and aspects: resized down to max_pixels, up to min_pixels, long and thin, sideways.
IMAGES = [png(64, 48, 1), png(200, 120, 2), png(300, 300, 3), png(20, 20, 4), png(7, 150, 5)]
SIDEWAYS = jpeg_sideways(120, 40)


@pytest.fixture(scope="module")
def store() -> Any:
    root = Path(tempfile.mkdtemp(prefix="titoflow-test-image-inputs-"))
    store = ImageStore(root)
    for data in [*IMAGES, SIDEWAYS]:
        store.put(data)
    yield store
    shutil.rmtree(root, ignore_errors=True)


def record(data: bytes, offset: int) -> ImageRecord:
    with Image.open(io.BytesIO(data)) as image:
        width, height = image.size
        if image.getexif().get(0x0112) == 6:
            width, height = height, width
    return ImageRecord(
        sha256=hashlib.sha256(data).hexdigest(),
        offset=offset,
        length=PROCESSING.tokens(height, width),
        grid_thw=PROCESSING.grid_thw(height, width),
        processor=FINGERPRINT,
    )


def image_segment(
    name: str, images: list[bytes], *, reversed_records: bool = False
) -> SegmentFinalized:
    """A two-step segment: a user turn holding ``images`` (each as vision start, its run of image
    pads, vision end, between text), a completion, a tool result with the last image, another
    completion; ``images`` are recorded in token order (or reversed, as a record list may be)."""
    first, second = images[:-1], images[-1:]
    records: list[ImageRecord] = []

    def context(start: int, shown: list[bytes], text: int) -> list[int]:
        ids = [text, text + 1]
        for data in shown:
            ids.append(VISION_START_ID)
            made = record(data, start + len(ids))
            records.append(made)
            ids += [IMAGE_PAD_ID] * made.length
            ids += [VISION_END_ID, text + 2]
        return ids

    one = context(0, first, 1000)
    two = context(len(one) + 2, second, 2000)
    segment = step_segment(
        name, (one, [11, 12], [-0.5, -0.25]), (two, [13, 14, 15], [-0.1, -0.2, -0.3])
    )
    listed = records[::-1] if reversed_records else records
    return segment.model_copy(update={"images": listed})


# --- one segment's inputs ---------------------------------------------------------------------


def test_a_segment_s_inputs_are_the_processor_s_output_for_its_bytes_in_token_order(
    store: ImageStore,
) -> None:
    shown = [IMAGES[1], SIDEWAYS, IMAGES[2], IMAGES[1], IMAGES[4]]  # one image shown twice
    segment = image_segment("a", shown, reversed_records=True)
    inputs = image_inputs(segment, store)
    expected = reference_inputs(shown)
    assert inputs.pixel_values.dtype == np.float32
    assert np.array_equal(inputs.pixel_values, expected["pixel_values"])
    assert inputs.image_grid_thw.dtype == np.int64
    assert inputs.image_grid_thw.tolist() == expected["image_grid_thw"].tolist()
    assert [r.offset for r in inputs.records] == [start for start, _ in runs(segment.token_ids)]
    assert inputs.image_grid_thw[1].tolist() == [1, 8, 2]  # upright: 40 wide, 120 high
    # Each record's run is as long as its grid's merged patches.
    merged = inputs.image_grid_thw.prod(axis=1) // FINGERPRINT.merge_size**2
    assert merged.tolist() == [length for _, length in runs(segment.token_ids)]
    # One processor per fingerprint: an equal fingerprint finds the one already built.
    assert processor_for(FINGERPRINT.model_copy()) is processor_for(FINGERPRINT)
    empty = image_inputs(filled_segment("text", [-0.5, -0.5]), store)
    assert empty.pixel_values.shape == (0, 0) and empty.image_grid_thw.shape == (0, 3)


def test_pixels_that_do_not_match_the_recorded_tokens_raise_naming_the_image(
    store: ImageStore, tmp_path: Path
) -> None:
    segment = image_segment("a", [IMAGES[0], IMAGES[1], IMAGES[3]])
    good = segment.images[1]  # 200x120: grid (1, 8, 12), 24 placeholder ids

    def with_record(changed: ImageRecord) -> SegmentFinalized:
        records = [changed if r is good else r for r in segment.images]
        return segment.model_copy(update={"images": records})

    # The processor the fingerprint names resizes differently: another grid, another run.
    other = ImageProcessorFingerprint(
        **(FINGERPRINT.model_dump(exclude={"sha256"}) | {"max_pixels": 64 * 64})
    )
    with pytest.raises(ImageMismatch, match=f"{good.sha256}.*grid_thw.*placeholder ids"):
        image_inputs(with_record(good.model_copy(update={"processor": other})), store)
    # The record's grid is not the image's.
    with pytest.raises(ImageMismatch, match=f"{good.sha256}.*grid_thw \\(1, 8, 12\\) != recorded"):
        image_inputs(with_record(good.model_copy(update={"grid_thw": (1, 4, 4)})), store)
    # The run is shorter than the image's merged patches.
    shorter = good.model_copy(update={"length": good.length - 1})
    with pytest.raises(ImageMismatch, match=f"{good.sha256}.*24 placeholder ids != recorded 23"):
        image_inputs(with_record(shorter), store)
    # The run is not on placeholders, overlaps the one before, or runs past the tokens.
    for offset, problem in [
        (good.offset - 1, "not one placeholder id repeated"),
        (segment.images[0].offset, "overlaps the image before it"),
        (len(segment.token_ids), "past the segment's"),
    ]:
        moved = good.model_copy(update={"offset": offset})
        with pytest.raises(ImageMismatch, match=f"{good.sha256}.*{problem}"):
            image_inputs(with_record(moved), store)
    # Not in the store: named, with the store's directory.
    missing = good.model_copy(update={"sha256": "e" * 64})
    with pytest.raises(FileNotFoundError, match=f"image {'e' * 64} is not in the image store"):
        image_inputs(with_record(missing), store)
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        image_inputs(segment, ImageStore(tmp_path))


# --- SegmentDataset ---------------------------------------------------------------------------


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(st.lists(st.sampled_from(range(len(IMAGES))), max_size=3), min_size=1, max_size=6),
    st.one_of(st.none(), st.integers(0, 200)),
)
def test_items_carry_their_segments_images_in_order_at_their_runs(
    store: ImageStore, vl_model_dir: Path, shown: list[list[int]], extra_budget: int | None
) -> None:
    """Segments with 0-3 images each, one per row or packed to a budget: every item holds the
    pixels of exactly its segments' images, in row-major token order, each run where its pads
    are, and each segment's M-RoPE positions at its place; an item with no image has no image
    keys."""
    segments = [
        image_segment(f"s{n}", [IMAGES[i] for i in chosen])
        if chosen
        else filled_segment(f"s{n}", [-0.5, -0.25])
        for n, chosen in enumerate(shown)
    ]
    longest = max(len(s.token_ids) for s in segments)
    budget = None if extra_budget is None else longest + extra_budget
    items = list(
        SegmentDataset(segments, pad_id=PAD, pack_tokens=budget, image_store=store.root, mrope=True)
    )
    get_rope_index = qwen3_vl_rope_index(vl_model_dir)
    handed = iter(segments)
    for item in items:
        mine = list(itertools.islice(handed, len(item["segment_ids"])))
        assert item["segment_ids"] == [s.segment_id for s in mine]
        check_item_images(item, mine, store)
        check_item_positions(item, mine, get_rope_index)
    assert next(handed, None) is None


def test_a_segment_with_images_and_no_store_or_mrope_is_refused_not_trained_as_text(
    store: ImageStore,
) -> None:
    segments = [filled_segment("text", [-0.5]), image_segment("vl", [IMAGES[0], IMAGES[1]])]
    with pytest.raises(ValueError, match=r"seg-vl holds 2 images: pass .*image_store="):
        list(SegmentDataset(segments, pad_id=PAD, pack_tokens=4096, mrope=True))
    # Text positions would place the images' tokens as text: refused, not guessed.
    with pytest.raises(ValueError, match=r"seg-vl holds 2 images: .*mrope=True"):
        list(SegmentDataset(segments, pad_id=PAD, pack_tokens=4096, image_store=store))
    [text] = list(SegmentDataset(segments[:1], pad_id=PAD))  # text alone needs no store
    assert "pixel_values" not in text
    # mrope=True: a text item has M-RoPE's shape too (a trainer's items all have one), its four
    # rows the text positions.
    [vl_text] = list(SegmentDataset(segments[:1], pad_id=PAD, mrope=True))
    length = len(segments[0].token_ids)
    assert vl_text["position_ids"].tolist() == [[list(range(length))]] * 4
    # A grouped item of both, with the store: the text row carries nothing, the other its own.
    grouped = [s.model_copy(update={"instance_id": "p", "last_of_session": True}) for s in segments]
    [item] = list(
        SegmentDataset(
            grouped,
            pad_id=PAD,
            group_by_instance=True,
            group_size=2,
            image_store=store,
            mrope=True,
        )
    )
    check_item_images(item, grouped, store)
    assert item["image_sequence_ids"].tolist() == [1, 1]
    segment = grouped[1]
    bad = segment.model_copy(
        update={"images": [segment.images[0].model_copy(update={"grid_thw": (1, 2, 4)})]}
    )
    with pytest.raises(ImageMismatch, match=segment.images[0].sha256):
        list(SegmentDataset([bad], pad_id=PAD, image_store=store, mrope=True))


def test_a_packed_item_gives_each_segment_the_logits_the_qwen3_vl_policy_gives_it_alone(
    store: ImageStore, vl_model_dir: Path
) -> None:
    """The tiny Qwen3-VL policy (transformers, sdpa) on one packed row of two segments with
    images and a text one, with the item's ``[4, 1, L]`` position ids and the block-causal mask:
    each segment's logits are those of a forward on it alone, where the model computes its
    M-RoPE positions itself (``get_rope_index`` from ``mm_token_type_ids`` and the grids). The
    text positions alone (what the model expands a 2-D ``position_ids`` to) place the images
    wrongly."""
    segments = [
        image_segment("a", [IMAGES[1], SIDEWAYS]),
        filled_segment("t", [-0.5, -0.25]),
        image_segment("b", [IMAGES[2]]),
    ]
    total = sum(len(s.token_ids) for s in segments)
    [item] = list(
        SegmentDataset(segments, pad_id=PAD, pack_tokens=total, image_store=store, mrope=True)
    )
    policy: torch.nn.Module = transformers.AutoModelForImageTextToText.from_pretrained(
        vl_model_dir, dtype=torch.float32
    )
    policy.eval()
    packed_inputs = {
        "input_ids": item["input_ids"],
        "attention_mask": block_causal_mask(item["sequence_ids"]),
        "pixel_values": item["pixel_values"],
        "image_grid_thw": item["image_grid_thw"],
    }
    with torch.no_grad():
        packed = policy(**packed_inputs, position_ids=item["position_ids"]).logits[0]
        as_text = policy(**packed_inputs, position_ids=item["position_ids"][0]).logits[0]
        alone = []
        for segment in segments:
            ids = torch.tensor([segment.token_ids])
            inputs = image_inputs(segment, store)
            vision = (
                {
                    "pixel_values": torch.from_numpy(inputs.pixel_values),
                    "image_grid_thw": torch.from_numpy(inputs.image_grid_thw),
                }
                if segment.images
                else {}
            )
            alone.append(
                policy(
                    input_ids=ids, mm_token_type_ids=(ids == IMAGE_PAD_ID).int(), **vision
                ).logits[0]
            )
    start = 0
    for segment, own in zip(segments, alone, strict=True):
        end = start + len(segment.token_ids)
        assert torch.allclose(packed[start:end], own, atol=1e-4), segment.segment_id
        # After its first image, a segment's text positions are not its M-RoPE ones.
        moved = not torch.allclose(as_text[start:end], own, atol=1e-4)
        assert moved == bool(segment.images), segment.segment_id
        start = end


# --- trainer formats --------------------------------------------------------------------------


def test_verl_rows_carry_their_multi_modal_inputs(store: ImageStore) -> None:
    """verl's ``non_tensor_batch["multi_modal_inputs"]``: per row the processor's dict with
    ``images_seqlens`` as its agent loop adds it, ``{}`` for a text row."""
    vl = image_segment("vl", [IMAGES[2], SIDEWAYS])
    text = filled_segment("text", [-0.5, -0.25])
    batch = to_verl([vl, text], pad_id=PAD, image_store=store, mrope=True)
    rows = batch.non_tensor_batch["multi_modal_inputs"]
    assert rows.dtype == object and rows.shape == (2,) and rows[1] == {}
    expected = reference_inputs([IMAGES[2], SIDEWAYS])
    assert set(rows[0]) == {"pixel_values", "image_grid_thw", "images_seqlens"}
    assert np.array_equal(rows[0]["pixel_values"], expected["pixel_values"])
    assert rows[0]["image_grid_thw"].tolist() == expected["image_grid_thw"].tolist()
    grid = expected["image_grid_thw"]
    assert rows[0]["images_seqlens"].tolist() == (grid[:, 1] * grid[:, 2]).tolist()  # t = 1
    # The pads are in input_ids as verl lays them out, as many as the grids merge to.
    pads = int((batch.batch["input_ids"][0] == IMAGE_PAD_ID).sum())
    assert pads == int(grid.prod(axis=1).sum()) // FINGERPRINT.merge_size**2
    assert batch.meta_info["images_seqlens"] == rows[0]["images_seqlens"].tolist()
    assert to_verl([text], pad_id=PAD).non_tensor_batch["multi_modal_inputs"].tolist() == [{}]
    with pytest.raises(ValueError, match="seg-vl holds 2 images: pass to_verl\\(\\.\\.\\., image"):
        to_verl([text, vl], pad_id=PAD)
    # Without mrope=True the rows would get text positions: refused, not guessed.
    with pytest.raises(ValueError, match=r"seg-vl holds 2 images: .*mrope=True"):
        to_verl([text, vl], pad_id=PAD, image_store=store)


def position_segments() -> list[SegmentFinalized]:
    """Four images of differing aspects in a first turn (one shown twice) and one in the tool
    result of a later turn, in the response; one image alone in a later turn; two square-ish
    images; and two text rows of other lengths."""
    return [
        image_segment(
            "many", [IMAGES[1], SIDEWAYS, IMAGES[4], IMAGES[1], IMAGES[2]], reversed_records=True
        ),
        image_segment("later", [IMAGES[0]]),
        image_segment("two", [IMAGES[3], IMAGES[2]]),
        filled_segment("text", [-0.5, -0.25]),
        filled_segment("longer", [-0.5, -0.25, -0.125, -0.0625]),
    ]


@pytest.mark.parametrize("model", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_verl_position_ids_of_a_qwen_vl_policy_are_its_get_rope_index(
    store: ImageStore, vl_model_dir: Path, model: str
) -> None:
    """``mrope=True``: ``[B, 4, P + R]``, the text positions over each row's real tokens, then
    the model's own M-RoPE rows (transformers' ``get_rope_index``: the policy's Qwen3-VL, and
    Qwen2-VL's and Qwen2.5-VL's with their default configs' vision ids and merge size)."""
    segments = position_segments()
    batch = to_verl(segments, pad_id=PAD, prompt_length_to=300, image_store=store, mrope=True)
    get_rope_index = {
        "qwen2_vl": bound(transformers.Qwen2VLModel, transformers.Qwen2VLConfig()),
        "qwen2_5_vl": bound(transformers.Qwen2_5_VLModel, transformers.Qwen2_5_VLConfig()),
        "qwen3_vl": bound(
            transformers.Qwen3VLModel, transformers.AutoConfig.from_pretrained(vl_model_dir)
        ),
    }[model]
    ids, mask = (torch.from_numpy(batch.batch[k]) for k in ("input_ids", "attention_mask"))
    rows = batch.non_tensor_batch["multi_modal_inputs"]
    grids = np.concatenate([row["image_grid_thw"] for row in rows if row])
    assert len(grids) == 8
    expected, _ = get_rope_index(
        input_ids=ids,
        mm_token_type_ids=(ids == IMAGE_PAD_ID).int(),
        image_grid_thw=torch.from_numpy(grids),
        attention_mask=mask,
    )
    positions = batch.batch["position_ids"]
    assert positions.dtype == np.int64 and positions.shape == (5, 4, ids.shape[1])
    real = mask.bool().numpy()
    for row, segment in enumerate(segments):
        assert positions[row, 0, real[row]].tolist() == list(range(len(segment.token_ids)))
        assert positions[row][1:, real[row]].tolist() == expected[:, row][:, real[row]].tolist()
        assert (positions[row][:, ~real[row]] == 1).all()  # as verl pads them
        # An image's height row parts from its time row: these are not text positions.
        assert (positions[row, 2] != positions[row, 1]).any() == bool(segment.images)
    # prompt_length_to=300: every row starts with padding, and counts from its first real token.
    assert not real[:, 0].any()


def test_an_image_record_that_does_not_fit_its_run_has_no_positions() -> None:
    segment = image_segment("a", [IMAGES[0], IMAGES[1]])
    good = segment.images[1]  # grid (1, 8, 12): 4 x 6 merged, 24 pads, then its vision end
    positions = mrope_position_ids(segment)
    start = positions[0, good.offset]
    run = positions[:, good.offset : good.offset + good.length]
    assert run.max(axis=1).tolist() == [start, start + 3, start + 5]
    assert positions[:, good.offset + good.length].tolist() == [start + 6] * 3
    changes: list[dict[str, Any]] = [
        {"grid_thw": (1, 4, 4)},
        {"grid_thw": (2, 8, 12)},
        {"length": 23},
    ]
    for changed in changes:
        bad = good.model_copy(update=changed)
        moved = segment.model_copy(update={"images": [segment.images[0], bad]})
        with pytest.raises(ValueError, match=f"image {good.sha256}'s run"):
            mrope_position_ids(moved)


def test_verl_position_ids_are_verl_s_agent_loop_s(
    store: ImageStore, vl_model_dir: Path, tmp_path: Path
) -> None:
    """verl 0.7.1's ``_compute_position_ids``, run in .venv-verl on each row as its agent loop
    runs it (tests/support/verl_positions.py): equal to ``to_verl``'s, padding included, for
    Qwen2-VL, Qwen2.5-VL and Qwen3-VL, and for a text model (no processor) on text rows."""
    segments = position_segments()
    vl = to_verl(segments, pad_id=PAD, image_store=store, mrope=True)
    text, vl_text = (to_verl(segments[3:], pad_id=PAD, mrope=mrope) for mrope in (False, True))
    batches = {
        name: {k: made.batch[k] for k in ("input_ids", "attention_mask")}
        | {"multi_modal_inputs": list(made.non_tensor_batch["multi_modal_inputs"])}
        for name, made in [("vl", vl), ("text", text)]
    }
    given = {"batches": batches, "policy_path": str(vl_model_dir)}
    out = trainer_step(".venv-verl", "verl_positions", given, tmp_path)
    for model in ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]:
        assert out["vl"][model] == vl.batch["position_ids"].tolist(), model
        assert out["text"][model] == vl_text.batch["position_ids"].tolist(), model
    assert out["text"]["text"] == text.batch["position_ids"].tolist()
    assert text.batch["position_ids"].shape == text.batch["input_ids"].shape


@pytest.mark.parametrize("framework", ["slime", "miles"])
def test_slime_samples_carry_their_multimodal_train_inputs(
    store: ImageStore, framework: str
) -> None:
    vl = image_segment("vl", [IMAGES[0], IMAGES[4]]).model_copy(update={"reward": 1.0})
    text = filled_segment("t", [-0.5])
    [[fields], [text_fields]] = to_slime([vl, text], Status, image_store=store)
    defined = DEFINED[framework]["fields"]
    assert set(fields) <= set(defined)
    inputs = fields["multimodal_train_inputs"]
    assert conforms(inputs, defined["multimodal_train_inputs"]["type"], [])
    expected = reference_inputs([IMAGES[0], IMAGES[4]])
    # Tensors: both move them with .to(device) and torch.cat them per key across samples
    # (slime backends/megatron_utils/data.py:146, miles backends/training_utils/data.py:345).
    assert torch.equal(inputs["pixel_values"], torch.from_numpy(expected["pixel_values"]))
    assert inputs["image_grid_thw"].tolist() == expected["image_grid_thw"].tolist()
    assert "multimodal_train_inputs" not in text_fields
    with pytest.raises(ValueError, match="pass to_slime\\(\\.\\.\\., image_store=\\)"):
        to_slime([vl], Status)


def openrlhf_segments() -> list[SegmentFinalized]:
    """One prompt's group of three: two samples with images (one shown twice), one text."""
    return [
        segment.model_copy(update={"instance_id": "p", "reward": reward})
        for segment, reward in [
            (image_segment("vl", [IMAGES[0], IMAGES[4]]), 1.0),
            (filled_segment("t", [-0.5, -0.25]), 0.0),
            (image_segment("vl2", [IMAGES[3], SIDEWAYS, IMAGES[3]]), 0.5),
        ]
    ]


def test_openrlhf_samples_carry_their_mm_train_inputs(store: ImageStore) -> None:
    """``mm_train_inputs``: per sample ``[inputs]`` as its agent path sets it, the processor's
    tensors for a sample with images, ``[None]`` for a text one."""
    segments = openrlhf_segments()
    samples = to_openrlhf(segments, n_samples_per_prompt=3, image_store=store)
    vl, text, vl2 = (s["mm_train_inputs"] for s in samples)
    assert text == [None]
    for [inputs], shown in [(vl, [IMAGES[0], IMAGES[4]]), (vl2, [IMAGES[3], SIDEWAYS, IMAGES[3]])]:
        expected = reference_inputs(shown)
        assert set(inputs) == {"pixel_values", "image_grid_thw"}
        assert torch.equal(inputs["pixel_values"], torch.from_numpy(expected["pixel_values"]))
        assert inputs["image_grid_thw"].dtype == torch.int64
        assert inputs["image_grid_thw"].tolist() == expected["image_grid_thw"].tolist()
    assert to_openrlhf(segments[1:2], n_samples_per_prompt=1)[0]["mm_train_inputs"] == [None]
    with pytest.raises(
        ValueError, match=r"seg-vl holds 2 images: pass to_openrlhf\(\.\.\., image_store="
    ):
        to_openrlhf(segments, n_samples_per_prompt=3)


def test_openrlhf_batches_and_forwards_the_images_in_its_own_code(
    store: ImageStore, vl_model_dir: Path, tmp_path: Path
) -> None:
    """OpenRLHF 0.11.2 in .venv-openrlhf (tests/support/openrlhf_images.py): the doc's block makes
    the
    ``Experience``s; its concat, split and collation keep each sample's images with it; its
    ``merge_mm_train_inputs`` gives the images in batch order; its VLM ``Actor`` forward takes
    them on the tiny Qwen3-VL, whose log probs the pixels move for the samples with images."""
    samples = to_openrlhf(openrlhf_segments(), n_samples_per_prompt=3, image_store=store)
    _, to_experiences = blocks_run_by("tests/trainers/test_trainer_openrlhf.py")
    given = {
        "samples": samples,
        "block": to_experiences,
        "model": str(vl_model_dir),
        "pad_token_id": PAD,
    }
    out = trainer_step(".venv-openrlhf", "openrlhf_images", given, tmp_path)
    assert out == {
        "concat": True,
        "split": True,
        "merged": True,
        "shape": True,
        "finite": True,
        "moved_by_pixels": [True, False, True],
    }


def test_tinker_datums_hold_an_image_chunk_in_place_of_each_run(store: ImageStore) -> None:
    """Text chunks around one image chunk per run, ``expected_tokens`` its length, so the input
    is as long as the arrays; targets inside an image are 0; an upright PNG's bytes are the
    stored ones, a sideways JPEG's are its upright pixels as a PNG."""
    shown = [IMAGES[0], SIDEWAYS, IMAGES[2]]
    segment = image_segment("vl", shown)
    datum = to_tinker(segment, advantage=1.0, image_store=store)
    chunks = datum["model_input"]["chunks"]
    ids = segment.token_ids
    assert [c["type"] for c in chunks] == ["encoded_text", "image"] * 3 + ["encoded_text"]
    laid: list[int] = []
    for chunk in chunks:
        laid += (
            chunk["tokens"] if chunk["type"] == "encoded_text" else [-1] * chunk["expected_tokens"]
        )
    image_at = np.array(
        [any(r.offset <= t < r.offset + r.length for r in segment.images) for t in range(len(ids))]
    )
    assert laid == [-1 if image else t for t, image in zip(ids[:-1], image_at[:-1], strict=True)]
    for array in datum["loss_fn_inputs"].values():
        assert array.shape == (len(laid),)
    targets = datum["loss_fn_inputs"]["target_tokens"]
    assert targets.tolist() == np.where(image_at[1:], 0, ids[1:]).tolist()
    images = [c for c in chunks if c["type"] == "image"]
    assert [c["expected_tokens"] for c in images] == [r.length for r in segment.images]
    assert [(c["data"], c["format"]) for c in images[::2]] == [
        (IMAGES[0], "png"),
        (IMAGES[2], "png"),
    ]
    assert images[1]["format"] == "png"
    with (
        Image.open(io.BytesIO(images[1]["data"])) as sent,
        Image.open(io.BytesIO(SIDEWAYS)) as kept,
    ):
        assert not sent.getexif()
        upright = np.asarray(ImageOps.exif_transpose(kept).convert("RGB"))
        assert upright.shape == (120, 40, 3)
        assert np.array_equal(np.asarray(sent), upright)
    with pytest.raises(
        ValueError, match=r"seg-vl holds 3 images: pass to_tinker\(\.\.\., image_store="
    ):
        to_tinker(segment)
    # The last token an image's: Tinker's input drops it, and an image chunk is not cut.
    last = segment.images[-1]
    first = segment.steps[0]
    span = slice(first.completion_start, first.completion_end)
    ending = step_segment(
        "end",
        (ids[: first.completion_start], ids[span], segment.logprobs[span]),
        (ids[first.completion_end : last.offset + last.length], [], []),
    ).model_copy(update={"images": segment.images})
    with pytest.raises(ValueError, match=f"seg-end ends in image {last.sha256}"):
        to_tinker(ending, image_store=store)


def test_tinker_datums_are_tinker_cookbook_s_for_the_same_sessions(
    store: ImageStore, vl_model_dir: Path, tmp_path: Path
) -> None:
    """tinker 0.38.0 and tinker-cookbook 0.6.1 in .venv-tinker (tests/support/tinker_images.py): the
    datums validate as ``Datum``s whose input is as long as their arrays, equal those cookbook's
    ``assemble_training_data`` makes from the sessions with ``ImageChunk``s of the stored bytes,
    and each image chunk's ``expected_tokens`` is what cookbook's ``image_to_chunk`` counts."""
    segments = [
        segment.model_copy(update={"instance_id": "p", "reward": reward})
        for segment, reward in [
            (image_segment("vl", [IMAGES[1], SIDEWAYS, IMAGES[4]]), 1.0),
            (filled_segment("t", [-0.5, -0.25]), 0.0),
        ]
    ]
    data, _ = to_tinker_batch(segments, image_store=store)

    def element(segment: SegmentFinalized, t: int) -> Any:
        for r in segment.images:
            if t == r.offset:
                data = store.get(r.sha256)
                kind = "jpeg" if data == SIDEWAYS else "png"
                return {"data": data, "format": kind, "expected_tokens": r.length}
        return None

    groups = []
    for segment in segments:
        inside = {t for r in segment.images for t in range(r.offset, r.offset + r.length)}
        steps = []
        for step in segment.steps:
            ob = [
                element(segment, t) or segment.token_ids[t]
                for t in range(step.completion_start)
                if t not in inside or element(segment, t)
            ]
            span = slice(step.completion_start, step.completion_end)
            steps.append((ob, segment.token_ids[span], segment.logprobs[span]))
        groups.append({"steps": steps, "reward": segment.reward})
    given = {"data": data, "groups": [groups], "policy_path": str(vl_model_dir)}
    out = trainer_step(".venv-tinker", "tinker_images", given, tmp_path)
    assert out == {
        "images": 3,
        "aligned": True,
        "cookbook": True,
        "expected_tokens": [True, True, True],
    }


def test_the_images_example_of_the_docs_runs_as_written(store: ImageStore) -> None:
    [example] = blocks_run_by("tests/titoflow/client/test_image_inputs.py")
    segments = [image_segment("a", [IMAGES[0], IMAGES[2]]), filled_segment("t", [-0.5])]
    namespace: dict[str, Any] = {"segments": segments, "image_dir": store.root}
    exec(compile(example, "docs/trainer.md", "exec"), namespace)
    assert namespace["inputs"].image_grid_thw.shape == (2, 3)
    assert namespace["item"]["image_sequence_ids"].tolist() == [0, 0]  # both packed in one row
