"""The closed contract: reason codes are enums whose every value is documented where readers
look (JSON Schemas, the AsyncAPI document, docs/events.md), a trainer can match on them
exhaustively, unknown values are handled as docs/events.md says, and the step and segment ids
are the one derivation in ``schemas/`` that the workers' segments carry."""

from __future__ import annotations

import json
from array import array
from typing import Any, assert_never

import pytest
from pydantic import ValidationError

from schemas.events import (
    DeadLetter,
    SegmentFinalized,
    SessionDiscarded,
    segment_id_for,
    segments_topic_adapter,
    step_id_for,
)
from schemas.export import render_schemas
from schemas.reasons import DeadLetterReason, DiscardReason, SplitReason
from tests.support.load import reference_segments, scripted_load
from titoflow.bus.asyncapi import render_asyncapi
from titoflow.settings import PROJECT_ROOT

REASONS = (SplitReason, DiscardReason, DeadLetterReason)
# Where each enum sits on the wire: event model and field.
FIELDS = {
    SplitReason: ("SegmentFinalized", "split_reason"),
    DiscardReason: ("SessionDiscarded", "reason"),
    DeadLetterReason: ("DeadLetter", "reason"),
}


@pytest.mark.parametrize("enum", REASONS, ids=lambda e: e.__name__)
def test_every_value_is_documented_wherever_readers_look(enum: Any) -> None:
    events_md = (PROJECT_ROOT / "docs" / "events.md").read_text()
    asyncapi = json.loads(render_asyncapi())["components"]["schemas"][enum.__name__]
    model, field = FIELDS[enum]
    schema = json.loads(render_schemas()[f"{model}.json"])
    component = schema["$defs"][enum.__name__]
    wire = [member.value for member in enum]
    assert component["enum"] == asyncapi["enum"] == wire
    referenced = json.dumps(schema["properties"][field])
    assert f"#/$defs/{enum.__name__}" in referenced  # the field is typed by the enum
    for member in enum:
        # Sentences saying when it happens, not a restated name.
        assert len(member.doc.split()) >= 8, member
        line = f"- `{member.value}`: {member.doc}"
        assert line in events_md and line in asyncapi["description"], member


def test_wire_values_are_the_strings_the_fields_carried_before() -> None:
    assert [m.value for m in SplitReason] == [
        "fork",
        "size",
        "tool_change",
        "history_rewrite",
        "retokenization",
        "template",
    ]
    assert [m.value for m in DiscardReason] == ["discarded", "empty"]
    notice = SessionDiscarded(session_id="s", event_time=1.0, reason=DiscardReason.EMPTY)
    assert json.loads(notice.model_dump_json())["reason"] == "empty"


def continues_context(segment: SegmentFinalized) -> bool:
    """docs/events.md's trainer example, verbatim: mypy proves the match exhaustive."""
    match segment.split_reason:
        case SplitReason.FORK | SplitReason.SIZE:
            return True
        case None | SplitReason.TOOL_CHANGE | SplitReason.HISTORY_REWRITE:
            return False
        case SplitReason.RETOKENIZATION | SplitReason.TEMPLATE:
            return False
        case _:
            assert_never(segment.split_reason)  # mypy: every value is handled


def test_the_documented_match_is_the_one_tested_here() -> None:
    source = (PROJECT_ROOT / "docs" / "events.md").read_text()
    for line in ("case SplitReason.FORK | SplitReason.SIZE:", "assert_never(segment.split_reason)"):
        assert line in source


def test_segments_off_the_wire_carry_enum_members_a_trainer_can_match() -> None:
    """Real segments, assembled by the worker's assembler from a scripted load with forks and
    resamples, read back as a trainer reads them."""
    segments = [
        segments_topic_adapter.validate_json(value)
        for value in reference_segments(scripted_load(seed=3, sessions=40)).values()
    ]
    reasons = {s.split_reason for s in segments if isinstance(s, SegmentFinalized)}
    assert SplitReason.FORK in reasons and None in reasons
    for segment in segments:
        assert isinstance(segment, SegmentFinalized)
        assert continues_context(segment) == (segment.split_reason is SplitReason.FORK)
        assert segment.segment_id == segment_id_for(segment.session_id, segment.steps[-1].step_id)


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"type": "segment_finalized", "split_reason": "rebase"}, "split_reason"),
        ({"type": "session_discarded", "reason": "expired"}, "reason"),
    ],
)
def test_an_unknown_value_is_refused_naming_its_field(payload: dict[str, Any], field: str) -> None:
    """A value a newer titoflow might add is not guessed at: the event does not validate."""
    segment = segments_topic_adapter.validate_json(
        next(iter(reference_segments(scripted_load(seed=5, sessions=1)).values()))
    )
    event = {**json.loads(segment.model_dump_json()), **payload}
    if payload["type"] == "session_discarded":
        event = {"type": "session_discarded", "session_id": "s", "event_time": 1.0, **payload}
    with pytest.raises(ValidationError) as refused:
        segments_topic_adapter.validate_python(event)
    assert field in {str(part) for error in refused.value.errors() for part in error["loc"]}


def test_dead_letters_from_before_the_codes_read_as_unclassified_with_their_text() -> None:
    letter = {
        "reason": "malformed step: completion_logprobs and completion_ids differ in length",
        "source_topic": "titoflow.steps",
        "source_partition": 0,
        "source_offset": 9,
        "key": "s",
        "value_b64": "e30=",
        "event_time": 1.0,
    }
    old = DeadLetter.model_validate_json(json.dumps(letter))
    assert old.reason is DeadLetterReason.UNCLASSIFIED and old.detail == letter["reason"]
    newer = DeadLetter.model_validate({**letter, "reason": "quota", "detail": "over"})
    assert (newer.reason, newer.detail) == (DeadLetterReason.UNCLASSIFIED, "quota: over")
    current = DeadLetter.model_validate({**letter, "reason": "late_step"})
    assert (current.reason, current.detail) == (DeadLetterReason.LATE_STEP, "")
    assert DeadLetter.model_validate_json(current.model_dump_json()) == current


def test_the_step_id_is_one_function_of_session_parent_tail_and_sample() -> None:
    tail = [151644, 77091, 198]
    ids = step_id_for("s", "p", array("i", tail), "a")
    assert ids == step_id_for("s", "p", tail, "a")  # the ingress' arrays and a test's lists
    assert len(ids) == 32 and int(ids, 16) >= 0
    others = {
        step_id_for("s", "p", tail, "b"),  # another sample of the same prompt
        step_id_for("s", None, tail, "a"),
        step_id_for("t", "p", tail, "a"),
        step_id_for("s", "p", tail[:-1], "a"),
    }
    assert ids not in others and len(others) == 4
