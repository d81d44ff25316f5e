"""Every event on every titoflow topic: the contract trainers and tools code against.

Topics (``<prefix>`` is configurable):

- ``<prefix>.steps``, key = session id: :class:`SessionOpened`, :class:`StepRecorded`,
  :class:`SessionFinalized`, :class:`SessionDiscarded` — one ordered log per session, so a
  finalize or discard never overtakes a step.
- ``<prefix>.segments``, key = instance id (else session id): :class:`SegmentFinalized`, and
  :class:`SessionDiscarded` for a session that yields no segment (discarded, or empty).
- ``<prefix>.recompute``, key = as segments: :class:`RecomputeRequested` — segments whose
  rebuilt tokens wait for the recompute stage to fill in the engine's prompt logprobs.
- ``<prefix>.dlq``: :class:`DeadLetter` — events no worker could use, with the reason.
- ``<prefix>.ended``, key = session id: :class:`SessionEnded` — how and when each session ended
  (the driver's finalize or discard, published by the ingress; an idle timeout, by a worker) —
  and :class:`SessionBudgeted`, a session's budget and sampling overrides when the driver set
  any at open. Every ingress replica follows it so that a second end of a session is refused and
  every replica enforces the budget and the overrides.

Every event has ``schema_version``; a reader that meets a version it does not know must not guess.
Large arrays are packed (see :mod:`schemas.arrays`). Events are JSON (UTF-8) on the wire.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from schemas.arrays import Float32Array, Int32Array, UInt8Array
from schemas.images import ImageRecord
from schemas.reasons import DeadLetterReason, DiscardReason, SplitReason
from schemas.routed_experts import RoutedExperts

SCHEMA_VERSION: Literal[1] = 1


class _Event(BaseModel):
    # Readers ignore fields they do not know, so adding a field is not a breaking change.
    model_config = ConfigDict(extra="ignore", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    session_id: str = Field(description="Scaffold session: one agent run.")
    event_time: float = Field(description="Unix seconds at the producer when the event was made.")


BuildMode = Literal["concat", "last-step"]


class SessionOptions(BaseModel):
    """Per-session options the workers apply (the ingress is stateless: it keeps none)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    build_mode: BuildMode | None = Field(
        None, description="How workers build this session's segments; None: the worker's setting."
    )


class SessionBudget(BaseModel):
    """Limits the rollout driver set on a session's model calls when it opened it (None: no
    limit). Beyond one, a model call is refused (400 ``session_budget_exceeded``); the session
    stays open for the driver's finalize or discard."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    turns: int | None = Field(
        None,
        ge=1,
        description="Model calls in one conversation: a call whose history holds this many "
        "assistant turns already is refused (a white-box call: its chain's steps).",
    )
    tokens: int | None = Field(
        None,
        ge=1,
        description="Tokens of a trajectory, prompt plus completion, per call: max_tokens is "
        "clamped to what remains (finish_reason length) and a prompt of this many is refused.",
    )
    wall_s: float | None = Field(
        None, gt=0, description="Seconds from the open call after which model calls are refused."
    )

    def __bool__(self) -> bool:
        return any(v is not None for v in (self.turns, self.tokens, self.wall_s))


LogprobsMode = Literal["raw_logprobs", "processed_logprobs"]


class SamplingOverrides(BaseModel):
    """Sampling the rollout driver forces on every model call of a session when it opened it,
    over what the scaffold sends (None: the scaffold's value stands)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    temperature: float | None = Field(None, ge=0.0, description="Used instead of the caller's.")
    top_p: float | None = Field(None, gt=0.0, le=1.0, description="Used instead of the caller's.")
    top_k: int | None = Field(
        None, ge=-1, description="Used instead of the caller's; -1: no top-k cut (0 is refused)."
    )
    max_tokens: int | None = Field(
        None, ge=1, description="A cap: a call generates at most this many tokens."
    )
    seed: int | None = Field(
        None,
        ge=0,
        le=2**63 - 1,
        description="With seed_policy fixed: the seed of every call; with per_step: the base "
        "each step's own seed derives from (with the step id).",
    )
    seed_policy: Literal["fixed", "per_step"] | None = Field(
        None,
        description="fixed: every call is sampled with `seed`; per_step: each step with a seed "
        "derived from `seed` (0 if unset) and its step id, recorded on the step. None: fixed "
        "when `seed` is set, else the caller's seed.",
    )

    @model_validator(mode="after")
    def _coherent(self) -> SamplingOverrides:
        if self.top_k == 0:
            raise ValueError("top_k 0 is ambiguous: -1 turns the top-k cut off, k >= 1 keeps k")
        if self.seed_policy == "fixed" and self.seed is None:
            raise ValueError("seed_policy fixed needs a seed")
        return self

    def __bool__(self) -> bool:
        fields = (self.temperature, self.top_p, self.top_k, self.max_tokens, self.seed)
        return self.seed_policy is not None or any(v is not None for v in fields)


class SamplingUsed(BaseModel):
    """How one step was sampled: the parameters the engine was sent (after the driver's
    overrides and the ingress's clamping) and what its logprobs are. Parameters titoflow does not
    send are at the engine's neutral default, recorded as such (top_k -1, min_p 0,
    repetition_penalty 1)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    temperature: float
    top_p: float
    top_k: int = Field(-1, description="-1: no top-k cut.")
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: list[str] = Field(default_factory=list, description="Stop strings.")
    stop_token_ids: list[int] = Field(default_factory=list)
    max_tokens: int = Field(description="After clamping to the context, the caps and the budget.")
    constrained: bool = Field(
        False, description="Constrained decoding (tool_choice required/named) applied."
    )
    logprobs_mode: LogprobsMode = Field(
        "raw_logprobs",
        description="What the completion logprobs are: raw_logprobs, the model's own "
        "distribution (before temperature, top-k/top-p); processed_logprobs, the distribution "
        "sampled from (after them). The engine's --logprobs-mode, as the ingress was told it "
        "(TITOFLOW_ENGINE_LOGPROBS_MODE).",
    )

    @property
    def cut(self) -> bool:
        """Whether top-p, top-k or min-p cut the distribution sampled from."""
        return self.top_p < 1.0 or self.top_k > 0 or self.min_p > 0.0


class SamplingAsked(BaseModel):
    """The sampling a call asked for, before the driver's overrides and the ingress's clamping
    (an API's own default where the call said nothing, e.g. temperature 1.0)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    temperature: float
    top_p: float
    top_k: int = Field(-1, description="-1: not asked (no top-k cut).")
    seed: int | None = None
    max_tokens: int | None = Field(None, description="None: not asked (the ingress's default).")
    stop: list[str] = Field(default_factory=list)


class SessionOpened(_Event):
    """A session announced before its first call (optional: sessions also start implicitly)."""

    type: Literal["session_opened"] = "session_opened"
    instance_id: str | None = Field(None, description="The prompt/task this session samples.")
    channel: str | None = Field(None, description="A label such as train or val; free-form.")
    metadata: dict[str, Any] = Field(default_factory=dict)
    options: SessionOptions = Field(default_factory=SessionOptions)
    budget: SessionBudget = Field(default_factory=SessionBudget)
    sampling: SamplingOverrides = Field(
        default_factory=SamplingOverrides,
        description="Sampling the driver forced on the session's calls (steps record what each "
        "call asked and what it was sent).",
    )


class VersionSpan(BaseModel):
    """Completion tokens ``[start, end)`` were sampled by weights labelled ``version``."""

    model_config = ConfigDict(frozen=True)

    version: str
    start: int
    end: int


def step_id_for(
    session_id: str, parent_step_id: str | None, prompt_tail: Sequence[int], sample: str
) -> str:
    """A step's id (``StepRecorded.step_id``): one per sample, so two engine calls never share
    one, even for the same prompt (a client retry, best-of-n), nor do their tool-call ids.
    ``sample`` is drawn once per engine call (the ingress: a random hex); the event carries the
    id, so re-sends and replays keep it. The tail counts as int32 ids."""
    tail = prompt_tail if isinstance(prompt_tail, array) else array("i", prompt_tail)
    digest = hashlib.sha256(f"{session_id}\0{parent_step_id or ''}\0{sample}\0".encode())
    digest.update(tail.tobytes())
    return digest.hexdigest()[:32]


class StepRecorded(_Event):
    """One call of the policy: the exact prompt and completion token ids the engine saw and made.

    The full prompt is ``tokens(parent_step)[:prefix_len] + prompt_tail_ids`` where
    ``tokens(step)`` is that step's full prompt followed by its completion. ``prefix == "tito"``
    means the ingress reused the parent's tokens verbatim (``prefix_len`` of them);
    ``prefix == "rendered"`` means it rendered the whole conversation (no parent,
    ``prefix_len == 0``, ``prompt_tail_ids`` is the whole prompt).
    """

    type: Literal["step_recorded"] = "step_recorded"
    step_id: str = Field(
        description="This sample's own id: two engine calls never share one, even for the same "
        "prompt (a client retry, best-of-n). Fixed when the call is made and carried here, so "
        "re-sends and replays keep it; the tool-call ids the client got derive from it. "
        "step_id_for(session_id, parent_step_id, prompt_tail_ids, a random per-call sample)."
    )
    chain_id: str = Field(description="Lineage of steps this one extends (id of its first step).")
    parent_step_id: str | None = Field(
        None, description="The sample whose output this call's history continues (tito steps)."
    )
    prefix: Literal["tito", "rendered"]
    prefix_len: int = Field(ge=0)
    prompt_tail_ids: Int32Array
    completion_ids: Int32Array
    completion_logprobs: Float32Array = Field(
        description="Logprob the engine reported for each sampled completion token."
    )
    weight_versions: list[VersionSpan] = Field(
        default_factory=list, description="Engine-reported spans over completion tokens, if any."
    )
    finish_reason: str
    instance_id: str | None = None
    turn_id: str | None = None
    api: Literal["openai.chat", "anthropic.messages", "openai.responses", "generate"] = Field(
        description="The API the call came in through; generate: the white-box token API "
        "(no messages: new_messages is empty and response_message is {})."
    )
    stream: bool = Field(False, description="Whether the client asked for a streamed answer.")
    matcher: Literal["strict", "tool_call_id"] = Field(
        "strict", description="How the request's history was matched to the cached chain."
    )
    model: str
    engine_url: str
    engine_request_id: str
    new_messages: list[dict[str, Any]] = Field(
        description="Request messages this step added beyond its parent (all of them if rendered)."
    )
    response_message: dict[str, Any] = Field(description="The assistant message the client got.")
    tool_parse_error: str | None = None
    tools_hash: str = Field(
        "", description="Digest of the tools and template switches the prompt was rendered with."
    )
    tools: list[dict[str, Any]] = Field(
        default_factory=list,
        description="The tools the prompt was rendered with, on rendered steps only (a chain's "
        "TITO steps share its tools): what workers re-render with.",
    )
    template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Chat-template switches (enable_thinking...), on rendered steps only.",
    )
    constrained: bool = Field(
        False,
        description="Sampled under constrained decoding (tool_choice required/named): the "
        "completion logprobs are of the grammar-masked distribution.",
    )
    routed_experts: RoutedExperts | None = Field(
        None,
        description="MoE routing replay, only when the engine returns it: expert ids for the "
        "positions of this step's prompt + completion that no earlier step of the chain "
        "recorded, [prefix_len - 1, prompt_len + completion_len - 1) on a tito step (the "
        "parent's last token was first fed to the model here), from 0 on a rendered one. The "
        "last completion token has no row: it was never fed to the model.",
    )
    sampling: SamplingUsed | None = Field(
        None,
        description="The sampling parameters the engine was sent and the logprob mode (None: a "
        "step from a titoflow that did not record them).",
    )
    sampling_asked: SamplingAsked | None = Field(
        None, description="The sampling the call asked for, before the driver's overrides."
    )
    images: list[ImageRecord] = Field(
        default_factory=list,
        description="Every image of the step's full prompt, in prompt order, at its offset in "
        "the full prompt (tokens(parent)[:prefix_len] + prompt_tail_ids); empty for a text "
        "step. Its bytes are in the image store (TITOFLOW_IMAGE_STORE_DIR) before the step is "
        "published, never in an event; new_messages name images by their sha256 alone.",
    )
    render_ms: float
    engine_ms: float


class SessionFinalized(_Event):
    """The scaffold (or rollout driver) declared the session done; workers emit its segments."""

    type: Literal["session_finalized"] = "session_finalized"
    reward: float | None = Field(None, description="The session's scalar reward, if given.")
    reward_components: dict[str, float] = Field(
        default_factory=dict, description="Named reward components, if given."
    )
    metadata: dict[str, Any] = Field(default_factory=dict)


class SessionDiscarded(_Event):
    """A session that yields no segment.

    On ``<prefix>.steps`` the rollout driver aborted it (``reason: discarded``): workers drop
    what they assembled and finalize nothing. On ``<prefix>.segments`` (key = instance, else
    session) a worker says so downstream, with ``reason`` ``discarded`` or ``empty`` (finalized
    without a generated token), so whoever waits for the session's segments stops waiting.
    """

    type: Literal["session_discarded"] = "session_discarded"
    reason: DiscardReason = DiscardReason.DISCARDED
    instance_id: str | None = None
    channel: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class SessionEnded(_Event):
    """A session ended, once: what made it end and when (``event_time``). Later finalizes and
    discards of it are refused (HTTP 409 naming this), and later steps are dead-lettered."""

    type: Literal["session_ended"] = "session_ended"
    how: Literal["finalized", "discarded", "idle"] = Field(
        description="finalized / discarded: the rollout driver's call (the driver plane); "
        "idle: a worker's idle timeout (TITOFLOW_IDLE_FINALIZE_S), no reward."
    )


class SessionBudgeted(_Event):
    """A session's budget and sampling overrides, and its instance where group routing needs it,
    on ``<prefix>.ended`` so that every ingress replica applies them (replicas do not read the
    steps topic); ``event_time`` is when the session opened, from which ``budget.wall_s``
    counts. Compaction keeps the session's end instead, once it ended."""

    type: Literal["session_budgeted"] = "session_budgeted"
    budget: SessionBudget
    sampling: SamplingOverrides = Field(default_factory=SamplingOverrides)
    instance_id: str | None = Field(
        None,
        description="The instance the session was opened with, published when the ingress "
        "routes groups by instance (TITOFLOW_ENGINE_GROUP_ROUTING): a replica that never saw "
        "the open call routes the session's calls with its group.",
    )


EndedTopicEvent = Annotated[SessionEnded | SessionBudgeted, Field(discriminator="type")]
ended_adapter: TypeAdapter[SessionEnded | SessionBudgeted] = TypeAdapter(EndedTopicEvent)


StepsTopicEvent = Annotated[
    SessionOpened | StepRecorded | SessionFinalized | SessionDiscarded, Field(discriminator="type")
]
steps_topic_adapter: TypeAdapter[
    SessionOpened | StepRecorded | SessionFinalized | SessionDiscarded
] = TypeAdapter(StepsTopicEvent)


class SegmentStep(BaseModel):
    """Where one step's tokens sit in a segment: prompt tail ``[prompt_start, completion_start)``
    (loss mask 0), completion ``[completion_start, completion_end)`` (loss mask 1)."""

    model_config = ConfigDict(frozen=True)

    step_id: str
    prompt_start: int
    completion_start: int
    completion_end: int
    prefix: Literal["tito", "rendered"]
    finish_reason: str
    sampling: SamplingUsed | None = Field(
        None, description="The step's StepRecorded.sampling: how its completion was sampled."
    )
    sampling_asked: SamplingAsked | None = Field(
        None, description="The step's StepRecorded.sampling_asked."
    )


LOGPROB_SOURCE_NONE = 0
LOGPROB_SOURCE_SAMPLED = 1
# Sampled under the engine's constrained decoding (a forced tool call): vLLM reports the logprob
# of the grammar-masked distribution, not the policy's own; recompute before using it as such.
LOGPROB_SOURCE_CONSTRAINED = 2
# Not sampled here (a rebuilt prefix, a re-rendered turn): the engine's prompt logprob of the token
# in this segment's context, filled in by the recompute stage.
LOGPROB_SOURCE_RECOMPUTED = 3

DIVERGENCE_CLASSES = ("cache_miss", "template", "retokenization", "history_rewrite", "tool_change")


def segment_id_for(session_id: str, last_step_id: str) -> str:
    """A segment's id (``SegmentFinalized.segment_id``). A step ends at most one segment, so
    (session, last step) names one: a worker that re-reads a session from mid-way rebuilds a
    segment already emitted with the same id, and consumers drop the repeat."""
    return hashlib.sha256(f"{session_id}\0{last_step_id}".encode()).hexdigest()[:32]


class SegmentFinalized(_Event):
    """One training sample: a linear chain of steps with their exact tokens.

    ``token_ids``, ``loss_mask``, ``logprobs`` and ``logprob_source`` are aligned. Context tokens
    (prompts) have loss mask 0 and logprob source 0 (``none``, logprob 0.0 is a placeholder, not a
    value); generated tokens have loss mask 1 and source 1 (``sampled``: the engine's logprob).
    ``segment_id`` is derived from content, so a replay re-emits byte-identical segments and
    consumers drop duplicates by id.
    """

    type: Literal["segment_finalized"] = "segment_finalized"
    segment_id: str = Field(description="segment_id_for(session_id, the last step's step_id).")
    chain_id: str
    instance_id: str | None = None
    rollout_id: str = Field(
        "", description="The rollout this sample belongs to: metadata rollout_id, else the session."
    )
    token_ids: Int32Array
    loss_mask: UInt8Array
    logprobs: Float32Array
    logprob_source: UInt8Array = Field(
        description="0 = none (context, or a token masked because its logprob is unknown), "
        "1 = sampled, 2 = sampled under constrained decoding (logprob of the grammar-masked "
        "distribution), 3 = recomputed (the engine's prompt logprob in this segment's context)."
    )
    weight_versions: list[VersionSpan] = Field(
        default_factory=list,
        description="Spans over segment token positions: which weights sampled those tokens.",
    )
    steps: list[SegmentStep]
    finalize_reason: Literal["finalized", "idle", "size"] = Field(
        description="Who closed this segment: finalized (the rollout driver's finalize, the "
        "only source of reward and finalize metadata), idle (a worker's idle timeout, no reward) "
        "or size (the size limit closed it while the session went on)."
    )
    split_reason: SplitReason | None = Field(
        None,
        description="Why this segment does not continue an earlier one of its session. None: "
        "the session's first segment.",
    )
    routed_experts: RoutedExperts | None = Field(
        None,
        description="MoE routing replay: expert ids per segment token position, from the "
        "steps' rows. Normally start 0 and len(token_ids) - 1 rows (the last token was never fed "
        "to the model). Rows stop early where a step brought none (an engine without "
        "--enable-return-routed-experts): positions from start + rows on are unknown. None: no "
        "step brought any.",
    )
    build_mode: Literal["concat", "last-step"] = Field(
        "concat",
        description="concat: the tokens the engine saw, step after step; last-step: the final "
        "conversation re-rendered with the chat template, assistant turns trainable.",
    )
    diagnostics: dict[str, int] = Field(
        default_factory=dict,
        description="Counts over the session so far: divergence classes (cache_miss, template, "
        "retokenization, history_rewrite, tool_change), rebuilt (divergences repaired by "
        "recompute), rebuild_fallback (recompute or last-step impossible, kept as split/concat), "
        "forks, unused_samples, tool-call parse errors, and per segment recompute_failed.",
    )
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="Session metadata: SessionOpened's, then finalize's."
    )
    channel: str | None = Field(None, description="The session's channel (SessionOpened).")
    reward: float | None = Field(None, description="The reward the finalize call carried.")
    reward_components: dict[str, float] = Field(
        default_factory=dict, description="Named reward components the finalize call carried."
    )
    last_of_session: bool = Field(
        False,
        description="The last segment of its session: every other one precedes it in the same "
        "partition (same key), so a reader that sees it has the whole session.",
    )
    images: list[ImageRecord] = Field(
        default_factory=list,
        description="Every image of token_ids, in order, at its offset in token_ids: its run "
        "of placeholder ids is context (loss mask 0) and lies whole in the segment (segments "
        "are cut after a step's completion, never inside a prompt). Bytes: the image store.",
    )
    unused_sample: bool = Field(
        False,
        description="This segment's only trainable tokens are a sample nobody continued while "
        "another sample of the same prompt was continued (or, when none was, a later one "
        "exists): a client retry or an unpicked best-of-n candidate. Its tokens are exact; the "
        "session's reward was not earned through it. SegmentConsumer skips these unless asked.",
    )


SegmentsTopicEvent = Annotated[SegmentFinalized | SessionDiscarded, Field(discriminator="type")]
segments_topic_adapter: TypeAdapter[SegmentFinalized | SessionDiscarded] = TypeAdapter(
    SegmentsTopicEvent
)


class RecomputeRequested(_Event):
    """A segment whose tokens with ``logprob_source`` 3 still need their logprobs: the recompute
    stage asks the engine for prompt logprobs, fills them in, and publishes ``segment`` to
    ``<prefix>.segments``."""

    type: Literal["recompute_requested"] = "recompute_requested"
    segment: SegmentFinalized


class DeadLetter(BaseModel):
    """An event a worker could not use. The original bytes are kept so nothing is lost."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    type: Literal["dead_letter"] = "dead_letter"
    reason: DeadLetterReason
    detail: str = Field("", description="More on the reason, free text (see reason).")
    source_topic: str
    source_partition: int
    source_offset: int
    key: str | None
    value_b64: str
    event_time: float

    @model_validator(mode="before")
    @classmethod
    def _unclassified(cls, data: Any) -> Any:
        # A letter is read for a person, never acted on: one whose reason is no member (free
        # text from before the reasons were closed, or a newer value) keeps that text as detail.
        reason = data.get("reason") if isinstance(data, dict) else None
        if not isinstance(reason, str) or reason in DeadLetterReason._value2member_map_:
            return data
        detail = f"{reason}: {data['detail']}" if data.get("detail") else reason
        return {**data, "reason": DeadLetterReason.UNCLASSIFIED, "detail": detail}


ALL_EVENTS: dict[str, type[BaseModel]] = {
    cls.__name__: cls
    for cls in (
        SessionOpened,
        StepRecorded,
        SessionFinalized,
        SessionDiscarded,
        SessionEnded,
        SessionBudgeted,
        SegmentFinalized,
        RecomputeRequested,
        DeadLetter,
    )
}
