"""The closed reason codes of the events: why a segment does not continue an earlier one
(``SegmentFinalized.split_reason``), why a session yields no segment (``SessionDiscarded.reason``)
and why a record went to the DLQ (``DeadLetter.reason``).

Invariants:
- Each is a ``str`` enum: the wire value is the member's string, the same strings these fields
  carried when they were open, so every value an earlier titoflow wrote is a member (dead-letter
  reasons were free text then: see :class:`DeadLetterReason` ``unclassified``).
- Every member says exactly when it happens (``doc``); the JSON Schemas, the AsyncAPI document
  and docs/events.md show these texts, generated from here.
- Values are only added, never renamed or removed, and a reader never guesses: pydantic refuses
  a ``split_reason`` or discard ``reason`` it does not know (a ValidationError naming the field,
  as for an unknown ``type``), so a trainer's ``match`` over the members is exhaustive. Readers
  are upgraded before the workers that may write a new value.
"""

from __future__ import annotations

import inspect
from enum import StrEnum
from typing import Self

from pydantic import GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema


class _Reason(StrEnum):
    """A str enum whose members each carry the text of when they happen."""

    doc: str

    def __new__(cls, value: str, doc: str) -> Self:
        member = str.__new__(cls, value)
        member._value_ = value
        member.doc = doc
        return member

    @classmethod
    def documented(cls) -> str:
        """The enum's docstring and one Markdown bullet per value."""
        values = "\n".join(f"- `{member.value}`: {member.doc}" for member in cls)
        return f"{inspect.cleandoc(cls.__doc__ or '')}\n\n{values}"

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        # The values' meanings in the schema itself, where AsyncAPI viewers show them.
        schema = handler(core_schema)
        handler.resolve_ref_schema(schema)["description"] = cls.documented()
        return schema


class SplitReason(_Reason):
    """Why a segment does not continue an earlier segment of its session (null: the session's
    first segment)."""

    FORK = (
        "fork",
        "A branch. A TITO step continued a step that is not its segment's last (another sample "
        "of the same prompt was continued already, or the request went back to an earlier "
        "turn), a rendered prompt equals another segment's first prompt (that prompt sampled "
        "again), or an unused sample is emitted apart from the branch that shares its "
        "ancestors. The tokens shared with the earlier branch are this segment's context "
        "(loss mask 0).",
    )
    SIZE = (
        "size",
        "The chain's previous segment reached `max_segment_tokens` and was emitted "
        "(`finalize_reason` `size`); its tokens are this segment's context (loss mask 0).",
    )
    TOOL_CHANGE = (
        "tool_change",
        "A fully rendered prompt that does not start with the latest segment's tokens, "
        "rendered with other tools or template switches (another `tools_hash`).",
    )
    HISTORY_REWRITE = (
        "history_rewrite",
        "A fully rendered prompt that does not start with the latest segment's tokens, with the "
        "same tools, whose earlier messages differ from that segment's conversation (edited, "
        "compacted, injected into: a Claude Code `<system-reminder>`).",
    )
    RETOKENIZATION = (
        "retokenization",
        "A fully rendered prompt of the same conversation and tools whose ids part from the "
        "latest segment's inside a sampled completion whose text re-encodes to other ids "
        "(told apart only when the worker has the policy's tokenizer).",
    )
    TEMPLATE = (
        "template",
        "A fully rendered prompt of the same conversation and tools whose tokens differ "
        "otherwise: the chat template renders history as other text than was sampled (e.g. "
        "Qwen3 dropping `<think>` from earlier turns), or a worker without the policy's tokenizer "
        "could not tell a retokenization apart.",
    )


class DiscardReason(_Reason):
    """Why a session yields no segment."""

    DISCARDED = (
        "discarded",
        "The rollout driver discarded the session (`POST /sess/<id>/discard`): workers drop "
        "what they assembled. On `<prefix>.steps` this is the driver's event; on "
        "`<prefix>.segments` the worker's notice of it.",
    )
    EMPTY = (
        "empty",
        "The session ended (the driver's finalize, or the worker's idle timeout) without a "
        "single generated token: the worker's notice on `<prefix>.segments`.",
    )


class DeadLetterReason(_Reason):
    """Why a record went to `<prefix>.dlq`; `detail` says more, in free text."""

    UNDECODABLE_EVENT = (
        "undecodable_event",
        "A record of `<prefix>.steps` that is no event of this schema version (not JSON, an "
        "unknown `type` or `schema_version`, a field of the wrong type); detail: the first "
        "validation errors.",
    )
    MALFORMED_STEP = (
        "malformed_step",
        "A `step_recorded` event that no session can use whatever it holds (logprobs and "
        "completion of different lengths, a TITO step naming no parent or itself, a rendered "
        "step naming a parent prefix or with an empty prompt, a weight-version span outside the "
        "completion); detail: which.",
    )
    UNKNOWN_PARENT_STEP = (
        "unknown_parent_step",
        "A TITO step whose `parent_step_id` is no step of its session in this worker's state "
        "(its segment would lack its prefix).",
    )
    PREFIX_LENGTH_MISMATCH = (
        "prefix_length_mismatch",
        "A TITO step whose `prefix_len` is not where its parent's completion ends.",
    )
    STEP_ID_CONFLICT = (
        "step_id_conflict",
        "A step whose `step_id` another step of the session already has, with other tokens (a "
        "re-send of the same step is skipped, not dead-lettered).",
    )
    LATE_STEP = (
        "late_step",
        "A step of a session that already ended (finalized, discarded or idle): the call was "
        "generating when the end landed.",
    )
    ALREADY_ENDED = (
        "already_ended",
        "A finalize or discard of a session that already ended otherwise (two ends racing on "
        "two ingress replicas): the first end stands; detail: how and when it ended.",
    )
    PARTIAL_SESSION = (
        "partial_session",
        "An event of a session the worker cannot have whole: its first steps lie below where the "
        "worker began reading (a TITO step of a session it never saw open), or retention deleted "
        "some of its steps before they were read. Every event of the session, its end included, "
        "is dead-lettered instead of a segment made of part of it.",
    )
    ASSEMBLER_ERROR = (
        "assembler_error",
        "The worker's assembler raised on this event (a bug: it costs the event, not the "
        "partition); detail: the exception.",
    )
    UNDECODABLE_RECOMPUTE_REQUEST = (
        "undecodable_recompute_request",
        "A record of `<prefix>.recompute` that is no `recompute_requested` event of this schema "
        "version; detail: the first validation errors.",
    )
    RECOMPUTE_ERROR = (
        "recompute_error",
        "The recompute stage raised on this segment other than for an unavailable engine "
        "(which it waits for); detail: the exception.",
    )
    UNCLASSIFIED = (
        "unclassified",
        "A letter whose reason is none of the above: written by a titoflow from before the "
        "reasons were closed (free text) or by a newer one; detail: the reason as written.",
    )
