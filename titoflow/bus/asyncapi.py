"""The AsyncAPI document of every titoflow topic (written to ``docs/asyncapi.json`` by
``titoflow docs``, checked current by CI).

Invariant: the contract is derived from the event models and the topic list, never hand-written.
Channel addresses come from :meth:`Settings.topic`, payload schemas from the pydantic models in
:mod:`schemas.events` and :mod:`schemas.control` (the unions the readers parse with), and FastStream
lays them out as AsyncAPI 3.0. Only the prose is written here: each topic's key, producers and
consumers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from faststream.kafka import KafkaBroker
from faststream.specification import AsyncAPI
from pydantic import RootModel, create_model
from pydantic.json_schema import DEFAULT_REF_TEMPLATE, GenerateJsonSchema, JsonSchemaMode

from schemas.control import ControlEvent
from schemas.events import (
    SCHEMA_VERSION,
    DeadLetter,
    EndedTopicEvent,
    RecomputeRequested,
    SegmentsTopicEvent,
    StepsTopicEvent,
)
from titoflow.settings import Settings

# The defaults, not the environment: the document must not change with TITOFLOW_TOPIC_PREFIX.
_DEFAULTS = Settings.model_construct()


class _WirePayload(RootModel[Any]):
    # FastStream asks pydantic for the validation-mode JSON Schema, where packed arrays are
    # lists of numbers; on the wire they are base64 strings. The contract is what producers
    # write: the serialization mode, as in docs/schemas.
    @classmethod
    def model_json_schema(
        cls,
        by_alias: bool | None = None,
        ref_template: str = DEFAULT_REF_TEMPLATE,
        schema_generator: type[GenerateJsonSchema] = GenerateJsonSchema,
        mode: JsonSchemaMode = "serialization",
        *,
        union_format: Literal["any_of", "primitive_type_array"] = "any_of",
    ) -> dict[str, Any]:
        return super().model_json_schema(
            by_alias, ref_template, schema_generator, mode, union_format=union_format
        )


@dataclass(frozen=True)
class _Topic:
    address: str
    payload: Any  # the model, or the discriminated union, the topic's readers parse
    carries: str
    key: str
    produced_by: str
    consumed_by: str

    def payload_model(self) -> type[_WirePayload]:
        # Named after the topic (steps -> StepsTopic); the events keep their own names.
        name = self.address.rsplit(".", 1)[1].title() + "Topic"
        return create_model(name, __base__=_WirePayload, root=(self.payload, ...))

    def description(self) -> str:
        return (
            f"{self.carries}\n\nKey: {self.key}.\n\nProduced by: {self.produced_by}.\n\n"
            f"Consumed by: {self.consumed_by}."
        )


_TOPICS = (
    _Topic(
        _DEFAULTS.topic("steps"),
        StepsTopicEvent,
        carries="One ordered log per session: its opening, every policy call with its exact "
        "tokens, and its finalize or discard; kept TITOFLOW_STEPS_RETENTION_S.",
        key="session id (so a finalize or discard never overtakes a step)",
        produced_by="the ingress (a step per policy call; the rollout driver's open, finalize "
        "and discard via the ingress)",
        consumed_by="the workers (consumer group TITOFLOW_WORKER_GROUP), which assemble segments",
    ),
    _Topic(
        _DEFAULTS.topic("segments"),
        SegmentsTopicEvent,
        carries="Training samples, and a session_discarded notice for each session that "
        "yields none (discarded, or finalized without a generated token); kept "
        "TITOFLOW_SEGMENTS_RETENTION_S.",
        key="instance id, else session id (a session's segments keep their order)",
        produced_by="the workers; the recompute stage (segments whose logprobs it filled in)",
        consumed_by="the trainer (SegmentConsumer; RolloutClient in the rollout driver)",
    ),
    _Topic(
        _DEFAULTS.topic("recompute"),
        RecomputeRequested,
        carries="Segments with rebuilt tokens whose logprobs the engine must fill in; the "
        "completed segment goes on to the segments topic with the same id.",
        key="as the segments topic",
        produced_by="the workers",
        consumed_by="the recompute stage (consumer group TITOFLOW_RECOMPUTE_GROUP)",
    ),
    _Topic(
        _DEFAULTS.topic("dlq"),
        DeadLetter,
        carries="Records no worker could use, with the reason and the original bytes; kept "
        "TITOFLOW_DLQ_RETENTION_S.",
        key="the original record's key",
        produced_by="the workers; the recompute stage",
        consumed_by="operators (no titoflow service reads it)",
    ),
    _Topic(
        _DEFAULTS.topic("control"),
        ControlEvent,
        carries="Commands (pause, resume, weight version, engine pool changes) in one total "
        "order: the topic has exactly one partition.",
        key="`control`",
        produced_by="`titoflow control`; the ingress admin endpoint (POST /admin/control); a "
        "trainer, with any Kafka client",
        consumed_by="every ingress replica, each reading the whole log from the beginning (no "
        "consumer group)",
    ),
    _Topic(
        _DEFAULTS.topic("ended"),
        EndedTopicEvent,
        carries="How and when each session ended, once, and the budget a session was opened "
        "with (before its end); compacted, kept TITOFLOW_ENDED_RETENTION_S.",
        key="session id",
        produced_by="the ingress (a budget at the open; the rollout driver's finalize or "
        "discard); the workers (idle timeout)",
        consumed_by="every ingress replica, from the beginning, so a second end is refused and "
        "every replica enforces a session's budget",
    ),
)

_DESCRIPTION = f"""\
Every Kafka topic of titoflow and every event on it, generated by `titoflow docs` from the \
pydantic models of `schemas/` and the topic names of `titoflow/settings.py`.

Topic names use the default prefix `{_DEFAULTS.topic_prefix}`; a deployment sets its own with \
TITOFLOW_TOPIC_PREFIX. Events are UTF-8 JSON with `schema_version` (the version of this \
document) and `type`; readers ignore fields they do not know and must not guess at a \
`schema_version` they do not know. Token ids, logprobs and masks are base64 strings of packed \
little-endian arrays (docs/events.md). Images are never in an event: steps and segments name \
each image of their token ids by the sha256 of its bytes (ImageRecord: its placeholder run, \
grid_thw and the image processor's fingerprint; the run has loss mask 0 and a segment never \
cuts one), and the bytes are in the image store, TITOFLOW_IMAGE_STORE_DIR/<sha256[:2]>/<sha256>, \
written before the step that names them is published."""


def _broker() -> KafkaBroker:
    # Declaration only: never connected. FastStream gives every declaration a channel of its own,
    # so each topic is declared once, as a publisher (titoflow writes every topic); who reads it
    # is in its description.
    broker = KafkaBroker(
        "kafka:9092",
        description="The compose stack's Kafka. Elsewhere: TITOFLOW_BOOTSTRAP_SERVERS (empty: "
        "`titoflow up` starts tansu).",
    )
    for topic in _TOPICS:
        broker.publisher(
            topic.address,
            title=topic.address,
            description=topic.description(),
            schema=topic.payload_model(),
        )
    return broker


def render_asyncapi() -> str:
    """The AsyncAPI 3.0 document as JSON text, byte-stable across processes."""
    spec = AsyncAPI(
        _broker(),
        title="titoflow events",
        version=str(SCHEMA_VERSION),
        description=_DESCRIPTION,
    ).to_specification()
    # Sorted keys: FastStream keeps publishers in a WeakSet, so channel order varies by process.
    return json.dumps(spec.to_jsonable(), indent=2, sort_keys=True) + "\n"
