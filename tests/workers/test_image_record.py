"""Images on the record (issue 30, part 3), on the SCRIPTED ENGINE DOUBLE and the tiny Qwen3-VL
policy's tokenizer, template and processor config: every step names every image of its full
prompt (sha256, placeholder run, grid_thw, processor fingerprint) and never its bytes; the bytes
are in the content-addressed image store before the step is published; segments carry the
images at their runs in the segment's ids, loss mask 0, never cut; and the trainer's check
re-runs the pinned processor (transformers') on the stored bytes. The same on the real VL engine:
tests/e2e/test_e2e_chat_images.py."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from cli.dev.vl_policy import IMAGE_PAD_ID, write_processor
from schemas.events import SegmentFinalized, SessionFinalized, StepRecorded
from schemas.images import ImageProcessorFingerprint, ImageRecord
from tests.support.chat_images import (
    CALL,
    PROCESSING,
    TOOLS,
    client_for,
    image_part,
    png,
    vl_app,
    vl_options,
    vl_tokenizer,
)
from tests.support.factories import recorded_step
from tests.support.image_samples import runs
from titoflow.client.export import read_segments, write_parquet
from titoflow.client.image_check import check_image
from titoflow.errors import ImageStoreUnavailable
from titoflow.image_store import ImageStore
from titoflow.tito.image_grid import ImageProcessing, installed_version, upright_size
from titoflow.tito.render import ChatRenderer
from workers.assembler import Assembler
from workers.rebuild import Rebuilder

FINGERPRINT = PROCESSING.fingerprint("5.19.0")


async def two_image_turns(store: ImageStore) -> tuple[Any, Any, list[bytes]]:
    """A user image (not streamed), then a tool result holding a screenshot (streamed), with
    every image's bytes required in ``store`` when a step naming it is published."""
    app, engine, publisher = vl_app([CALL, "I see it.<|im_end|>"], vl_options(image_store=store))

    def stored_first(event: Any) -> None:
        if isinstance(event, StepRecorded):
            assert all(store.has(image.sha256) for image in event.images), "published first"

    publisher.on_publish = stored_first
    client = client_for(app)
    images = [png(100, 50), png(64, 96, (200, 10, 10))]
    messages: Any = [
        {"role": "user", "content": [{"type": "text", "text": "look: "}, image_part(images[0])]}
    ]
    answer = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    call = answer.choices[0].message.tool_calls[0]  # type: ignore[index]
    messages += [
        answer.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": [image_part(images[1])]},
    ]
    stream = await client.chat.completions.create(
        model="m", messages=messages, tools=TOOLS, stream=True
    )
    [chunk async for chunk in stream]
    return engine, publisher, images


async def test_steps_record_every_image_of_their_prompt_and_store_its_bytes_first(
    tmp_path: Path,
) -> None:
    """Turn 1 records its image at its run; turn 2 (TITO) records both, at their runs in its
    full prompt (the parent's tokens + its tail); each record's grid is the processor's and its
    length the grid's token count; the bytes were stored before each step was published."""
    store = ImageStore(tmp_path / "images")
    engine, publisher, images = await two_image_turns(store)
    one, two = publisher.steps()
    digest = [hashlib.sha256(data).hexdigest() for data in images]
    sizes = [upright_size(data) for data in images]
    grids = [PROCESSING.grid_thw(*size) for size in sizes]
    assert grids == [(1, 4, 6), (1, 6, 4)]

    assert [(i.sha256, i.offset, i.length, i.grid_thw) for i in one.images] == [
        (digest[0], *runs(engine.prompts[0])[0], grids[0])
    ]
    full_prompt = (one.prompt_tail_ids + one.completion_ids)[: two.prefix_len]
    full_prompt += two.prompt_tail_ids
    assert full_prompt == engine.prompts[1]
    assert [(i.sha256, i.offset, i.length, i.grid_thw) for i in two.images] == [
        (sha, offset, length, grid)
        for sha, (offset, length), grid in zip(digest, runs(full_prompt), grids, strict=True)
    ]
    for image in two.images:
        t, h, w = image.grid_thw
        assert image.length == t * h * w // FINGERPRINT.merge_size**2
        assert image.processor == FINGERPRINT
    # The bytes: in the store under their hash, each once.
    assert [store.get(sha) for sha in digest] == images
    assert sorted(p.name for p in (tmp_path / "images").rglob("*") if p.is_file()) == sorted(digest)


async def test_no_image_bytes_or_url_reach_an_event(tmp_path: Path) -> None:
    _, publisher, images = await two_image_turns(ImageStore(tmp_path))
    text = "".join(event.model_dump_json() for event in publisher.events)
    assert "data:" not in text and "base64" not in text
    for data in images:
        encoded = base64.b64encode(data).decode()
        assert encoded[:40] not in text and encoded[-40:] not in text
    # new_messages name an image by its hash and size alone.
    one, two = publisher.steps()
    parts = [p for m in [*one.new_messages, *two.new_messages] for p in m["content"]]
    assert [set(p) for p in parts if p["type"] == "image"] == [{"type", "image", "size"}] * 2


async def test_a_text_turn_records_no_images_and_stores_nothing(tmp_path: Path) -> None:
    app, _, publisher = vl_app(["hi<|im_end|>"], vl_options(image_store=ImageStore(tmp_path)))
    await client_for(app).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hello"}]
    )
    [step] = publisher.steps()
    assert step.images == [] and list(tmp_path.iterdir()) == []


async def test_an_image_stored_before_is_not_written_again(tmp_path: Path) -> None:
    """A replica that lost its cache renders the conversation again: its images are in the
    store already, and stay the very files they were, marked named again (their mtime, which
    a prune reads) before the step is published."""
    store = ImageStore(tmp_path)
    data = png(80, 80)
    messages: Any = [{"role": "user", "content": [image_part(data)]}]
    path = store.path(hashlib.sha256(data).hexdigest())
    inodes = []
    for _ in range(2):  # two apps: the second has an empty chain cache (a rendered step)
        app, _engine, publisher = vl_app(["ok<|im_end|>"], vl_options(image_store=store))
        publisher.on_publish = refreshed_first(path, after=time.time() - 1)
        await client_for(app).chat.completions.create(model="m", messages=messages)
        [step] = publisher.steps()
        assert step.prefix == "rendered" and len(step.images) == 1
        inodes.append(os.stat(path).st_ino)
        os.utime(path, (1_700_000_000, 1_700_000_000))  # named long ago, as far as a prune sees
    assert inodes[0] == inodes[1]


def refreshed_first(path: Path, after: float) -> Any:
    """A publish hook: the image at ``path`` was marked named at ``after`` or later before any
    step was published."""

    def check(event: Any) -> None:
        if isinstance(event, StepRecorded):
            assert os.stat(path).st_mtime >= after, "published before the image was refreshed"

    return check


@pytest.mark.parametrize("pruned", [False, True])
async def test_a_step_refreshes_the_images_its_chain_sends_by_uuid_or_writes_them_again(
    tmp_path: Path, pruned: bool
) -> None:
    """Turn 2 extends turn 1's chain (a TITO step): the engine gets turn 1's image by uuid
    alone, yet the step names it, so the step marks it named before it is published (a
    session's history keeps an image alive in the store as long as the session goes on).
    Pruned meanwhile (no step named it for the prune's age), it is written again from the
    chain's URL."""
    store = ImageStore(tmp_path)
    data = png(72, 48)
    path = store.path(hashlib.sha256(data).hexdigest())
    app, engine, publisher = vl_app(
        ["one<|im_end|>", "two<|im_end|>"], vl_options(image_store=store)
    )
    client = client_for(app)
    messages: Any = [{"role": "user", "content": [image_part(data)]}]
    answer = await client.chat.completions.create(model="m", messages=messages)
    inode = os.stat(path).st_ino
    os.utime(path, (1_700_000_000, 1_700_000_000))  # named long ago, as far as a prune sees
    if pruned:
        assert store.prune(3600).removed == 1 and not path.exists()
    messages += [
        answer.choices[0].message.model_dump(exclude_none=True),
        {"role": "user", "content": "and now?"},
    ]
    publisher.on_publish = refreshed_first(path, after=time.time() - 1)
    await client.chat.completions.create(model="m", messages=messages)
    _, two = publisher.steps()
    assert two.prefix == "tito" and [i.sha256 for i in two.images] == [path.name]
    assert engine.params[1].images[0].by_uuid  # not sent again: only the store needed it
    assert store.get(path.name) == data
    if not pruned:  # refreshed in place (a pruned one's inode number may be reused)
        assert os.stat(path).st_ino == inode


async def test_a_store_that_cannot_take_an_image_fails_the_call_and_publishes_nothing(
    tmp_path: Path,
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    app, _, publisher = vl_app(["ok<|im_end|>"], vl_options(image_store=ImageStore(blocked)))
    messages: Any = [{"role": "user", "content": [image_part(png(40, 40))]}]
    with pytest.raises(openai.InternalServerError) as failed:
        await client_for(app).chat.completions.create(model="m", messages=messages)
    assert failed.value.status_code == 503 and "image store" in failed.value.message
    assert publisher.events == []


def test_the_store_is_content_addressed_idempotent_and_atomic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ImageStore(tmp_path)
    data = png(10, 10)
    name = store.put(data)
    assert name == hashlib.sha256(data).hexdigest()
    assert store.path(name) == tmp_path / name[:2] / name and store.get(name) == data
    # Readable by the trainers, who share the volume as other users; written by its ingress.
    assert stat.S_IMODE(store.path(name).stat().st_mode) == 0o644
    assert store.put(data, name) == name and store.get(name) == data
    with pytest.raises(ValueError, match="hash to"):
        store.put(data, "0" * 64)
    with pytest.raises(ValueError, match="no sha256"):
        store.path("../etc/passwd")
    with pytest.raises(FileNotFoundError):
        store.get("f" * 64)
    # A write that fails midway leaves neither the image nor its temporary file.
    other = png(11, 11)

    def torn(source: str, target: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", torn)
    with pytest.raises(ImageStoreUnavailable, match="disk full"):
        store.put(other)
    monkeypatch.undo()
    assert not store.has(hashlib.sha256(other).hexdigest())
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == [name]
    # A file whose bytes are not its name's is refused on reading.
    store.path(name).write_bytes(b"tampered")
    with pytest.raises(ValueError, match="hashing to"):
        store.get(name)


def test_the_fingerprint_is_the_model_s_processor_config_and_hashes_canonically(
    tmp_path: Path,
) -> None:
    (tmp_path / "tokenizer_config.json").write_text("{}")
    write_processor(tmp_path)
    processing = ImageProcessing.of_model(tmp_path)
    assert processing == PROCESSING
    fingerprint = PROCESSING.fingerprint("5.19.0")
    assert fingerprint.model_dump(exclude={"sha256"}) == {
        "processor_class": "Qwen2VLImageProcessor",
        "backend": "torchvision",
        "patch_size": 16,
        "merge_size": 2,
        "temporal_patch_size": 2,
        "min_pixels": 1024,
        "max_pixels": 65536,
        "image_mean": (0.5, 0.5, 0.5),
        "image_std": (0.5, 0.5, 0.5),
        "rescale_factor": 1 / 255,
        "resample": 3,
        "transformers_version": "5.19.0",
    }
    # As documented: the sha256 of the other fields' JSON, keys sorted, no spaces.
    fields = json.loads(fingerprint.model_dump_json(exclude={"sha256"}))
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    assert canonical.startswith('{"backend":"torchvision","image_mean":[0.5,0.5,0.5],')
    assert fingerprint.sha256 == hashlib.sha256(canonical.encode()).hexdigest()
    # The hash survives the wire and changes with any field.
    assert ImageProcessorFingerprint.model_validate_json(fingerprint.model_dump_json()) == (
        fingerprint
    )
    assert PROCESSING.fingerprint("4.57.1").backend == "pil"
    for change in ({"max_pixels": 1 << 20}, {"resample": 2}, {"transformers_version": "5.2"}):
        fields = fingerprint.model_dump(exclude={"sha256"}) | change
        assert ImageProcessorFingerprint(**fields).sha256 != fingerprint.sha256


def test_the_engine_s_transformers_version_is_read_from_its_environment(tmp_path: Path) -> None:
    python = tmp_path / "venv" / "bin" / "python"
    assert installed_version(python, "transformers") == ""
    (tmp_path / "venv/lib/python3.12/site-packages/transformers-5.19.0.dist-info").mkdir(
        parents=True
    )
    assert installed_version(python, "transformers") == "5.19.0"


# --- segments ---------------------------------------------------------------------------------

PAD, OPEN, CLOSE = IMAGE_PAD_ID, 7, 8  # an image's placeholder, the markers around its run


@st.composite
def image_sessions(draw: st.DrawFn) -> list[StepRecorded]:
    """One session's steps: continuations, re-samples and forks of earlier steps, and cache
    misses (the whole prompt rendered), whose tails hold text and images (``OPEN``, a run of
    ``PAD``, ``CLOSE``); each step names every image of its full prompt."""
    made: list[tuple[list[int], StepRecorded]] = []  # (full prompt + completion, step)
    for n in range(draw(st.integers(1, 10))):
        tail: list[int] = []
        for _ in range(draw(st.integers(1, 3))):
            if draw(st.booleans()):
                tail += [OPEN, *[PAD] * draw(st.integers(1, 4)), CLOSE]
            else:
                tail += draw(st.lists(st.integers(0, 3), min_size=1, max_size=3))
        parent: StepRecorded | None = None
        base: list[int] = []
        kind = draw(st.sampled_from(["new", "continue", "continue", "fork", "miss", "resample"]))
        tito = [(f, e) for f, e in made if e.parent_step_id]
        if kind == "resample" and tito:  # a sibling: another sample of a TITO step's prompt
            sibling = draw(st.sampled_from(tito))[1]
            base, parent = next((f, e) for f, e in made if e.step_id == sibling.parent_step_id)
            tail = list(sibling.prompt_tail_ids)
        elif made and kind != "new":
            full, parent = made[-1] if kind == "continue" else draw(st.sampled_from(made))
            base = full
            if kind == "miss":
                tail, parent, base = full + tail, None, []
        prompt = base + tail
        runs_at = runs(prompt)
        sha_at = {r: hashlib.sha256(f"{prompt[: r[0]]}".encode()).hexdigest() for r in runs_at}
        completion = draw(st.lists(st.integers(0, 3), min_size=1, max_size=3))
        step = recorded_step(
            f"step-{n}",
            tail,
            completion,
            parent.step_id if parent else None,
            len(base),
            event_time=float(n),
            completion_logprobs=[-0.5] * len(completion),
            engine_request_id=f"r{n}",
            images=[
                ImageRecord(
                    sha256=sha_at[(at, length)],
                    offset=at,
                    length=length,
                    grid_thw=(1, 2, 2 * length),
                    processor=FINGERPRINT,
                )
                for at, length in runs_at
            ],
        )
        made.append((prompt + completion, step))
    return [step for _, step in made]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(image_sessions(), st.sampled_from([0, 5, 9, 16]))
def test_segments_carry_their_images_whole_at_their_runs_with_loss_mask_0(
    session: list[StepRecorded], max_segment_tokens: int
) -> None:
    """Whatever the forks, cache misses and size limits: each segment's images are exactly the
    placeholder runs of its token ids (none cut: a cut run would be shorter than its record),
    each named as the step that brought it named it, and no placeholder is trainable."""
    assembler = Assembler(max_segment_tokens=max_segment_tokens)
    segments: list[SegmentFinalized] = []
    for offset, step in enumerate(session):
        applied = assembler.apply(step.model_dump_json().encode(), 0, offset)
        assert applied.dead_letter_reason is None, applied.dead_letter_detail
        segments += applied.segments
    end = SessionFinalized(session_id="s", event_time=99.0, reward=1.0)
    segments += assembler.apply(end.model_dump_json().encode(), 0, len(session)).segments
    assert segments
    for segment in segments:
        ids = list(segment.token_ids)
        held = [(image.offset, image.length) for image in segment.images]
        assert held == runs(ids)
        for image in segment.images:
            assert image.offset + image.length <= len(ids)
            assert ids[image.offset - 1] == OPEN and ids[image.offset + image.length] == CLOSE
            assert not any(segment.loss_mask[image.offset : image.offset + image.length])
            expected = hashlib.sha256(f"{ids[: image.offset]}".encode()).hexdigest()
            assert image.sha256 == expected and image.processor == FINGERPRINT


async def test_a_last_step_segment_places_its_images_on_the_re_rendered_runs(
    tmp_path: Path,
) -> None:
    """build_mode last-step re-renders the recorded conversation: each image's record moves to
    its run in the new tokens, as concat's sits on its run in the engine's."""
    engine, publisher, images = await two_image_turns(ImageStore(tmp_path))
    rebuilder = Rebuilder(ChatRenderer(vl_tokenizer()), PROCESSING)
    digest = [hashlib.sha256(data).hexdigest() for data in images]
    for mode in ("concat", "last-step"):
        assembler = Assembler(rebuilder=rebuilder, build_mode=mode)
        for offset, event in enumerate(publisher.events):
            assembler.apply(event.model_dump_json().encode(), 0, offset)
        end = SessionFinalized(session_id="s1", event_time=9.0, reward=1.0)
        [segment] = assembler.apply(end.model_dump_json().encode(), 0, 99).segments
        assert segment.build_mode == mode
        ids = list(segment.token_ids)
        assert [(i.sha256, i.offset, i.length) for i in segment.images] == [
            (sha, *run) for sha, run in zip(digest, runs(ids), strict=True)
        ]
        assert rebuilder.image_runs(ids) == runs(ids)
        for image in segment.images:
            assert not any(segment.loss_mask[image.offset : image.offset + image.length])
    assert engine.prompts[1] == ids[: len(engine.prompts[1])]


async def test_an_export_keeps_each_segment_s_images(tmp_path: Path) -> None:
    _, publisher, _ = await two_image_turns(ImageStore(tmp_path / "images"))
    assembler = Assembler()
    for offset, event in enumerate(publisher.events):
        assembler.apply(event.model_dump_json().encode(), 0, offset)
    end = SessionFinalized(session_id="s1", event_time=9.0, reward=1.0)
    [segment] = assembler.apply(end.model_dump_json().encode(), 0, 99).segments
    assert len(segment.images) == 2
    write_parquet([segment], tmp_path / "out.parquet")
    [back] = read_segments(tmp_path / "out.parquet")
    assert back.images == segment.images


# --- the trainer's check ----------------------------------------------------------------------


def jpeg(width: int, height: int, orientation: int | None = None) -> bytes:
    image = Image.new("RGB", (width, height), (20, 160, 90))
    out = io.BytesIO()
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation
    image.save(out, format="JPEG", exif=exif.tobytes())
    return out.getvalue()


CHECKED = [
    png(100, 50),
    png(64, 96),
    png(7, 300),  # long and thin
    png(1000, 640),  # resized down to max_pixels
    png(20, 20),  # resized up to min_pixels
    jpeg(200, 90),
    jpeg(200, 90, orientation=6),  # stored sideways: upright it is 90 wide, 200 high
]


async def test_the_trainer_s_check_finds_the_recorded_grid_in_the_stored_bytes(
    tmp_path: Path,
) -> None:
    """Each image through the ingress (titoflow's own computation, recorded), then through
    transformers' processor of the fingerprint on the stored bytes: the same grid and count."""
    store = ImageStore(tmp_path)
    app, _, publisher = vl_app(["ok<|im_end|>"], vl_options(image_store=store, max_images=16))
    messages: Any = [{"role": "user", "content": [image_part(data) for data in CHECKED]}]
    await client_for(app).chat.completions.create(model="m", messages=messages)
    [step] = publisher.steps()
    assert len(step.images) == len(CHECKED)
    assert step.images[-1].grid_thw == PROCESSING.grid_thw(200, 90)  # upright
    for record in step.images:
        checked = check_image(record, store)
        assert checked.differences == [], checked
        assert checked.ok and checked.backend == "pil"  # no torchvision beside the trainer
        assert checked.processor_class == "Qwen2VLImageProcessorPil"
    # A record whose processor differs from the one that made its grid: the check says how.
    record = step.images[3]
    other = record.processor.model_copy(update={"max_pixels": 16384, "sha256": ""})
    moved = record.model_copy(
        update={"processor": ImageProcessorFingerprint(**other.model_dump(exclude={"sha256"}))}
    )
    checked = check_image(moved, store)
    assert not checked.ok
    assert (
        checked.differences[0].startswith("grid_thw")
        and "placeholder ids" in (checked.differences[1])
    )
    with pytest.raises(FileNotFoundError):
        check_image(record.model_copy(update={"sha256": "e" * 64}), store)
