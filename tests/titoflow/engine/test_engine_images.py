"""A prompt's images as an engine takes them (titoflow/engine/image_expansion.py): each expanded run
is sent as one placeholder, and only the engine's expansion back to the very same ids and runs is
taken. The engine's side of it runs in tests/titoflow/engine/test_engine_vl.py."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from titoflow.engine.api import EngineImage, GenerateParams
from titoflow.engine.image_expansion import (
    check_expansion,
    content_parts,
    engine_prompt,
    runs_in_order,
)
from titoflow.engine.sglang import SGLangEngine
from titoflow.errors import EngineError

PAD, START, END = 151655, 151652, 151653
TEXT_IDS = st.lists(st.integers(0, 151_000), max_size=6)


@st.composite
def prompts(draw: st.DrawFn) -> tuple[list[int], list[EngineImage], list[int]]:
    """A canonical prompt with image runs between text, its images, and the ids with one
    placeholder per image (what the engine must be sent)."""
    ids: list[int] = draw(TEXT_IDS)
    sent, images = list(ids), []
    for n, length in enumerate(draw(st.lists(st.integers(1, 40), max_size=5))):
        ids.append(START)
        sent.append(START)
        images.append(EngineImage(len(ids), length, f"sha-{n}", f"data:,{n}", draw(st.booleans())))
        ids.extend([PAD] * length)
        sent.append(PAD)
        tail = [END, *draw(TEXT_IDS)]
        ids.extend(tail)
        sent.extend(tail)
    return ids, images, sent


@given(prompts())
def test_each_run_is_sent_as_one_placeholder_and_only_its_own_expansion_is_taken(
    prompt: tuple[list[int], list[EngineImage], list[int]],
) -> None:
    ids, images, sent = prompt
    assert engine_prompt(ids, images) == sent
    runs = {"image": [{"offset": i.offset, "length": i.length} for i in images]}
    check_expansion(ids, images, ids, runs)
    if images:  # the engine expanding the already expanded run: one pad too many per image
        first = images[0]
        doubled = [*ids[: first.offset], PAD, *ids[first.offset :]]
        with pytest.raises(EngineError, match="expanded"):
            check_expansion(ids, images, doubled, runs)
        shifted = {"image": [{"offset": i.offset + 1, "length": i.length} for i in images]}
        with pytest.raises(EngineError, match="expanded"):
            check_expansion(ids, images, ids, shifted)
    with pytest.raises(EngineError):
        check_expansion(ids, images, None, None)


def test_runs_must_be_ordered_disjoint_inside_and_one_repeated_id() -> None:
    ids = [1, PAD, PAD, PAD, 2, PAD, PAD, 3]
    runs_in_order(ids, [EngineImage(1, 3, "a", "u"), EngineImage(5, 2, "b", "u")])
    for bad in (
        [EngineImage(5, 2, "b", "u"), EngineImage(1, 3, "a", "u")],  # out of order
        [EngineImage(1, 3, "a", "u"), EngineImage(3, 2, "b", "u")],  # overlapping
        [EngineImage(6, 3, "a", "u")],  # past the end
        [EngineImage(0, 2, "a", "u")],  # a text id in the run
        [EngineImage(1, 0, "a", "u")],  # empty
    ):
        with pytest.raises(ValueError):
            engine_prompt(ids, bad)


def test_an_image_goes_by_uuid_alone_only_when_asked_and_not_on_a_resend() -> None:
    images = [EngineImage(1, 4, "new", "data:new"), EngineImage(9, 4, "seen", "data:seen", True)]
    assert content_parts(images) == [
        {"type": "image_url", "url": "data:new", "uuid": "new"},
        {"type": "image_url", "url": None, "uuid": "seen"},
    ]
    assert [part["url"] for part in content_parts(images, resend=True)] == ["data:new", "data:seen"]


async def test_the_sglang_backend_refuses_images_rather_than_drop_them() -> None:
    engine = SGLangEngine("http://127.0.0.1:9", timeout_s=1)
    params = GenerateParams(max_tokens=1, images=(EngineImage(1, 1, "a", "data:,a"),))
    try:
        with pytest.raises(EngineError, match="does not take images"):
            engine.body([1, PAD], params, "r", "s", stream=False)
    finally:
        await engine.close()
