"""An engine call's step event and the chain head it leaves: one path for chat turns and
white-box calls.

Invariants:
- The step holds exactly what the engine saw and made, and how it was asked to sample (the
  parameters sent, with what the caller asked before the driver's overrides): its prompt is
  ``tokens(parent)[:prefix_len] + prompt_tail_ids`` (all of it in the tail on a ``rendered``
  step), its completion the engine's ids and logprobs; the head holds that prompt + completion,
  so the next call that extends the chain sends the very tokens the step records.
- A white-box call differs from a chat turn only in knowing no conversation: its step has no
  messages and no tools of its own (workers place it by tokens alone), and its head is recorded
  with ``ChainStore.advance_tokens``, which keeps the parent's messages so no chat request
  matches it.
- A chain's tools and template switches are on its rendered step only; its TITO steps share them.
- Every image of the prompt is on the step (:func:`image_records`), at its offset in the full
  prompt, named by its bytes' hash; the bytes never are (the recorder stores them first).
"""

from __future__ import annotations

import hashlib
import time
from array import array

from ingress.turns import sampling
from ingress.turns.chains import Chain, ChainStore
from ingress.turns.prompts import AnyCall
from ingress.turns.turn import ChatTurn
from ingress.turns.turn_images import held_images
from schemas.events import LogprobsMode, StepRecorded
from schemas.images import ImageProcessorFingerprint, ImageRecord
from schemas.routed_experts import RoutedExperts
from titoflow.engine.api import Generation
from titoflow.tito.messages import Message
from titoflow.tito.output import ParsedOutput


def answer_message(parsed: ParsedOutput) -> Message:
    """The assistant message a chat client got."""
    return Message(
        role="assistant",
        content=parsed.content,
        reasoning=parsed.reasoning,
        tool_calls=tuple(parsed.tool_calls),
    )


def step_event(
    call: AnyCall,
    generation: Generation,
    engine_ms: float,
    stream: bool,
    parsed: ParsedOutput | None,
    answer: Message | None,
    logprobs_mode: LogprobsMode = "raw_logprobs",
    image_processor: ImageProcessorFingerprint | None = None,
) -> StepRecorded:
    """The step of ``call``; ``parsed`` and ``answer`` are a chat turn's (None: white-box);
    ``logprobs_mode``: what the engine's logprobs are; ``image_processor``: what processed the
    prompt's images (None: the policy reads none)."""
    parent, request = call.parent, call.request
    turn = request if isinstance(request, ChatTurn) else None
    return StepRecorded(
        session_id=request.session.session_id,
        event_time=time.time(),
        step_id=call.step_id,
        chain_id=parent.chain_id if parent else call.step_id,
        parent_step_id=parent.head_step_id if parent else None,
        prefix="tito" if parent else "rendered",
        prefix_len=len(parent.tokens) if parent else 0,
        prompt_tail_ids=call.tail.tolist(),
        completion_ids=generation.token_ids,
        completion_logprobs=generation.logprobs,
        weight_versions=generation.weight_versions,
        finish_reason=generation.finish_reason,
        instance_id=request.session.instance_id,
        turn_id=request.session.turn_id,
        api=turn.api if turn else "generate",
        stream=stream,
        matcher=call.matcher,
        model=request.model,
        engine_url=generation.engine_url,
        engine_request_id=generation.request_id,
        new_messages=[m.template_dict() for m in turn.messages[call.covered :]] if turn else [],
        response_message=answer.template_dict() if answer else {},
        tool_parse_error=parsed.parse_error if parsed else None,
        tools_hash=_tools_hash(_tools_digest(turn, parent)),
        # What a worker needs to re-render the chain; its TITO steps share them.
        tools=list(turn.tools) if turn and parent is None else [],
        template_kwargs=dict(turn.template_kwargs) if turn and parent is None else {},
        constrained=call.params.structured is not None,
        routed_experts=_new_rows(generation, call.params.routed_experts_start),
        sampling=sampling.used(call.params, logprobs_mode),
        sampling_asked=sampling.asked(request),
        images=image_records(call, image_processor) if call.params.images else [],
        render_ms=call.render_ms,
        engine_ms=engine_ms,
    )


def image_records(call: AnyCall, processor: ImageProcessorFingerprint | None) -> list[ImageRecord]:
    """Every image of ``call``'s prompt as its step records it."""
    assert processor is not None, "ServiceOptions holds a fingerprint wherever images are read"
    return [
        ImageRecord(
            sha256=image.uuid,
            offset=image.offset,
            length=image.length,
            grid_thw=image.grid_thw,
            processor=processor,
        )
        for image in call.params.images
    ]


def advance_chain(
    chains: ChainStore,
    call: AnyCall,
    step: StepRecorded,
    answer: Message | None,
    end_ids: frozenset[int],
    version: str | None,
) -> None:
    """Record the head ``step`` leaves as the tip of its chain. ``version``: the control log's
    weight version when the call was admitted, the chain's first if it starts one."""
    parent, request = call.parent, call.request
    turn = request if isinstance(request, ChatTurn) else None
    completion = array("i", step.completion_ids)
    # Clients rarely echo reasoning (and no matcher compares it): kept without it, the echo
    # matches field for field, the cheap way (see ChainStore.find). A white-box head gets its
    # parent's messages from advance_tokens.
    messages = (
        (*turn.messages, answer.model_copy(update={"reasoning": None})) if turn and answer else ()
    )
    head = Chain(
        chain_id=step.chain_id,
        tools_digest=_tools_digest(turn, parent) or _EMPTY_KEY_DIGEST,
        messages=messages,
        tokens=call.prompt + completion,
        head_step_id=step.step_id,
        end_token=completion[-1] if completion and completion[-1] in end_ids else None,
        depth=parent.depth + 1 if parent else 1,
        first_version=parent.first_version if parent else version,
        prior=parent.summary() if parent and turn else None,
        images=held_images(call.params.images, len(call.prompt)) if call.params.images else (),
    )
    if turn:
        chains.advance(request.session.session_id, parent, head)
    else:
        chains.advance_tokens(request.session.session_id, parent, head)


def _tools_digest(turn: ChatTurn | None, parent: Chain | None) -> str | None:
    """The digest of the tools and template switches the prompt was made under: the turn's,
    else (white-box) its chain's; None for a white-box prompt no chain holds."""
    return turn.tools_digest if turn else parent.tools_digest if parent else None


# What a chain no tools key was made for (a white-box prompt no chain held) carries: the empty
# key's digest, so its white-box steps record the tools_hash they recorded before digests.
_EMPTY_KEY_DIGEST = hashlib.sha256(b"").hexdigest()


def _tools_hash(tools_digest: str | None) -> str:
    return tools_digest[:16] if tools_digest is not None else ""


def _new_rows(generation: Generation, first: int) -> RoutedExperts | None:
    """Only this step's rows, also from an engine that ignored ``routed_experts_start``."""
    rows = generation.routed_experts
    return rows.between(first, rows.end) if rows else None
