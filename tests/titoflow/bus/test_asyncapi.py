"""The AsyncAPI document (titoflow/bus/asyncapi.py, docs/asyncapi.json) covers every topic and every
event, validates real events as producers write them, and is byte-stable and checked in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, get_args, get_type_hints

import pytest
from jsonschema import Draft7Validator  # type: ignore[import-untyped]
from pydantic import BaseModel

from schemas.control import CONTROL_EVENTS, EngineAdded
from schemas.events import (
    ALL_EVENTS,
    DeadLetter,
    RecomputeRequested,
    SegmentFinalized,
    SegmentStep,
    SessionDiscarded,
    SessionEnded,
    StepRecorded,
    VersionSpan,
)
from schemas.reasons import DeadLetterReason
from schemas.routed_experts import RoutedExperts
from titoflow.bus.asyncapi import render_asyncapi
from titoflow.settings import PROJECT_ROOT, Settings

DOC: dict[str, Any] = json.loads(render_asyncapi())
DEFAULTS = Settings.model_construct()
# The names Settings.topic accepts: mypy holds every topic("...") call in the code to them.
TOPIC_NAMES = get_args(get_type_hints(Settings.topic)["name"])
ADDRESSES: dict[str, str] = {name: DEFAULTS.topic(name) for name in TOPIC_NAMES}

STEP = StepRecorded(
    session_id="s",
    event_time=1.5,
    step_id="st-2",
    chain_id="st-1",
    parent_step_id="st-1",
    prefix="tito",
    prefix_len=5,
    prompt_tail_ids=[4, 151644, 77091],
    completion_ids=[12, 13],
    completion_logprobs=[-0.25, -1.5],
    weight_versions=[VersionSpan(version="v1", start=0, end=2)],
    finish_reason="tool_calls",
    api="openai.chat",
    model="qwen",
    engine_url="http://engine:8000",
    engine_request_id="r-1",
    new_messages=[{"role": "tool", "content": "42"}],
    response_message={"role": "assistant", "content": None, "tool_calls": []},
    routed_experts=RoutedExperts(start=4, shape=(3, 2, 2), dtype="uint8", data=bytes(range(12))),
    render_ms=0.5,
    engine_ms=20.0,
)
SEGMENT = SegmentFinalized(
    session_id="s",
    event_time=2.0,
    segment_id="seg-1",
    chain_id="st-1",
    token_ids=[1, 2, 3],
    loss_mask=[0, 1, 1],
    logprobs=[0.0, -0.25, -1.5],
    logprob_source=[0, 1, 3],
    steps=[
        SegmentStep(
            step_id="st-1",
            prompt_start=0,
            completion_start=1,
            completion_end=3,
            prefix="rendered",
            finish_reason="stop",
        )
    ],
    finalize_reason="finalized",
    reward=1.0,
)
ONE_EVENT_PER_TOPIC: dict[str, BaseModel] = {
    "steps": STEP,
    "segments": SEGMENT,
    "recompute": RecomputeRequested(session_id="s", event_time=2.0, segment=SEGMENT),
    "dlq": DeadLetter(
        reason=DeadLetterReason.UNDECODABLE_EVENT,
        detail="[{'type': 'json_invalid'}]",
        source_topic="titoflow.steps",
        source_partition=0,
        source_offset=7,
        key="s",
        value_b64="/w==",
        event_time=3.0,
    ),
    "control": EngineAdded(event_time=4.0, url="http://engine:8000", weight=0.1),
    "ended": SessionEnded(session_id="s", event_time=5.0, how="idle"),
}


def payload_validator(topic: str) -> Draft7Validator:
    """Validates against the payload of the topic's channel, following the document's refs."""
    [message] = DOC["channels"][topic]["messages"].values()
    # AsyncAPI schemas are JSON Schema draft 7 plus keywords a validator ignores.
    return Draft7Validator({"$ref": f"{message['$ref']}/payload", "components": DOC["components"]})


def wire(event: BaseModel) -> dict[str, Any]:
    """The event as a producer puts it on the topic."""
    parsed: dict[str, Any] = json.loads(event.model_dump_json())
    return parsed


def test_every_topic_has_one_channel_and_nothing_else_does() -> None:
    addresses = set(ADDRESSES.values())
    assert set(DOC["channels"]) == addresses
    for address, channel in DOC["channels"].items():
        assert channel["address"] == channel["bindings"]["kafka"]["topic"] == address
        assert "Key:" in channel["description"]
        assert "Produced by:" in channel["description"]
        assert "Consumed by:" in channel["description"]
    used = sorted(op["channel"]["$ref"] for op in DOC["operations"].values())
    assert used == sorted(f"#/channels/{address}" for address in addresses)
    assert "TITOFLOW_TOPIC_PREFIX" in DOC["info"]["description"]


def test_every_event_model_is_a_component_with_its_wire_schema() -> None:
    models: list[type[BaseModel]] = [*ALL_EVENTS.values(), *CONTROL_EVENTS]
    for model in models:
        # The serialization-mode schema docs/schemas has, its refs pointing into components.
        schema = model.model_json_schema(mode="serialization")
        schema.pop("$defs", None)
        expected = json.loads(json.dumps(schema).replace("#/$defs/", "#/components/schemas/"))
        assert DOC["components"]["schemas"][model.__name__] == expected, model.__name__


@pytest.mark.parametrize("name", TOPIC_NAMES)
def test_a_real_event_validates_against_its_channel_payload(name: str) -> None:
    payload_validator(ADDRESSES[name]).validate(wire(ONE_EVENT_PER_TOPIC[name]))


def test_steps_payload_holds_packed_arrays_and_rejects_what_is_not_a_step() -> None:
    validator = payload_validator(ADDRESSES["steps"])
    event = wire(STEP)
    assert isinstance(event["completion_ids"], str)  # packed base64, as the payload must allow
    validator.validate(event)
    assert not validator.is_valid({k: v for k, v in event.items() if k != "step_id"})
    assert not validator.is_valid({**event, "prefix": "guessed"})
    assert not validator.is_valid(wire(SEGMENT))  # a segments-topic event
    validator.validate(wire(SessionDiscarded(session_id="s", event_time=1.0)))


def test_render_is_byte_stable_across_processes_and_environments() -> None:
    env = {**os.environ, "PYTHONHASHSEED": "12345", "TITOFLOW_TOPIC_PREFIX": "elsewhere"}
    other = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from titoflow.bus.asyncapi import render_asyncapi; "
            "sys.stdout.write(render_asyncapi())",
        ],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert other == render_asyncapi()
    assert str(PROJECT_ROOT) not in other


def test_checked_in_document_is_current() -> None:
    assert (PROJECT_ROOT / "docs" / "asyncapi.json").read_text() == render_asyncapi(), (
        "run `titoflow docs`"
    )
