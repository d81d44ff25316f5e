"""The ingress core: one call from internal request to durable step. Knows no HTTP and no Kafka.

:class:`ChatService` is the surface the adapters, the session routes and ``app.py`` use; it
wires the pieces, each with its own invariant: :mod:`ingress.turns.admission` (refusals, the pause
gate), :mod:`ingress.turns.prompts` (the prompt from cached chains, the step id),
:mod:`ingress.turns.image_urls` (images given by URL, fetched before the prompt is built),
:mod:`ingress.turns.generation` (the engine call, decoding and parsing), :mod:`ingress.turns.steps`
and
:mod:`ingress.turns.recording` (the step event, published, then the chain advanced) and
:mod:`ingress.turns.session_lifecycle` (opening and ending sessions). Chat turns and white-box calls
go through the same ones.

Invariants:
- Exact tokens: the prompt is the cached chain's tokens plus the template's continuation (TITO)
  or a full render on a cache miss; the completion is the engine's ids and logprobs, unchanged.
- A result means durable: :meth:`ChatService.complete` returns, and the stream of
  :meth:`ChatService.open_stream` yields :class:`TurnDone`, only after ``publish`` returned (the
  broker acknowledged the step); for a turn of ``n`` samples
  (:meth:`ChatService.complete_samples`, :meth:`ChatService.open_samples`), only after every
  sample's step was. Any failure before that raises and leaves the cache as it was: a retry
  extends the same chain as a new sample with its own step id.
"""

from __future__ import annotations

import asyncio
import sys
import time
import weakref
from collections.abc import AsyncIterator

from ingress.turns.admission import Admission, Capacity, Control, InFlight, Slot, turn_number
from ingress.turns.budgets import SessionBudgets
from ingress.turns.chains import ChainStore
from ingress.turns.detokenize import Decoder
from ingress.turns.ended_sessions import EndedSessions
from ingress.turns.generation import (
    CallRunner,
    SampleEvent,
    TokensResult,
    TokensSampled,
    TurnDone,
    TurnEvent,
    TurnResult,
    TurnStarted,
)
from ingress.turns.image_urls import ImageUrls
from ingress.turns.images import check_images, has_images
from ingress.turns.prompts import AnyCall, PreparedCall, PromptBuilder, samples_of
from ingress.turns.recording import StepRecorder
from ingress.turns.service_options import ServiceOptions
from ingress.turns.session_lifecycle import SessionLifecycle
from ingress.turns.session_log import Publish, PublishTogether, SessionEvent
from ingress.turns.tracing import CallTracer
from ingress.turns.turn import ChatTurn, TokenCall
from titoflow.engine.api import Engine
from titoflow.engine.groups import RoutingKeys
from titoflow.errors import InvalidRequest
from titoflow.tito.images import IMAGE_PAD, expand
from titoflow.tito.render import ChatRenderer

# What other modules import from here: the service's surface.
__all__ = [
    "ChatService",
    "SampleEvent",
    "ServiceOptions",
    "SessionEvent",
    "TokensResult",
    "TokensSampled",
    "TurnDone",
    "TurnEvent",
    "TurnResult",
    "TurnStarted",
]


class ChatService:
    def __init__(
        self,
        renderer: ChatRenderer,
        tokenizer: Decoder,
        engine: Engine,
        publish: Publish,
        chains: ChainStore,
        options: ServiceOptions,
        publish_together: PublishTogether | None = None,
        tracer: CallTracer | None = None,
        control: Control | None = None,
        ended: EndedSessions | None = None,
        budgets: SessionBudgets | None = None,
        capacity: Capacity | None = None,
        routing: RoutingKeys | None = None,
    ) -> None:
        self.renderer = renderer
        self.tokenizer = tokenizer
        self.engine = engine
        self.publish = publish
        self.chains = chains
        self.options = options
        self.tracer = tracer or CallTracer(enabled=False)
        self.control = control
        # None: an unbounded record (tests and benchmarks build services without settings).
        self.ended = ended if ended is not None else EndedSessions(kept=sys.maxsize)
        self.budgets = budgets if budgets is not None else SessionBudgets(kept=sys.maxsize)
        in_flight = InFlight(options.max_in_flight, options.retry_after_s)
        self.admission = Admission(options, control, self.ended, self.budgets, in_flight, capacity)
        self.prompts = PromptBuilder(renderer, chains, self.admission, options)
        self.image_urls = ImageUrls(options, renderer.token_id(IMAGE_PAD))
        recorder = StepRecorder(
            publish,
            chains,
            renderer.end_ids,
            options.logprobs_mode,
            publish_together,
            options.image_fingerprint,
            options.image_store,
        )
        self.records_samples = publish_together is not None
        # None: every call routes by its session id.
        self.routing = routing if routing is not None else RoutingKeys(by_instance=False, kept=0)
        self.runner = CallRunner(
            engine, tokenizer, renderer.family, renderer.end_ids, recorder, self.routing
        )
        # The rollout driver's session calls are the lifecycle's own.
        sessions = SessionLifecycle(publish, chains, self.ended, self.budgets, self.routing)
        self.open_session = sessions.open_session
        self.finalize = sessions.finalize
        self.discard = sessions.discard

    async def count_prompt_tokens(self, turn: ChatTurn) -> int:
        """The conversation's prompt length, rendered in full in a worker thread (a count
        request may carry megabytes; nothing is cached for it), each image as its expanded
        run, as a turn's prompt holds it."""
        turn = await self.image_urls.read(turn)
        render = self.renderer.full_prompt
        prompt = await asyncio.to_thread(render, turn.messages, turn.tools, turn.template_kwargs)
        if not has_images(turn.messages):
            return len(prompt)
        processing, pad = check_images(self.options, self.image_urls.pad_id, turn.messages)
        images = [image for message in turn.messages for image in message.images]
        try:
            return len(expand(prompt, images, processing, pad)[0])
        except ValueError as exc:
            raise InvalidRequest(str(exc), "messages") from exc

    async def complete(self, turn: ChatTurn) -> TurnResult:
        slot = self.admission.enter(turn.session.session_id, lambda: turn_number(turn))
        try:
            with self.tracer.call(turn.api, turn.session.session_id) as span:
                call = self.admission.fit_budget(await self._prompt(turn))
                return await self.runner.complete(call, await self._admit(call), span)
        finally:
            slot.release()

    async def complete_samples(self, turn: ChatTurn) -> list[TurnResult]:
        """The turn's ``n`` samples of one prompt (rendered once), a step each, all answered
        once all are durable; each sample takes a place in flight."""
        self._check_samples()
        session_id = turn.session.session_id
        slot = self.admission.enter(session_id, lambda: turn_number(turn), turn.n)
        try:
            with self.tracer.call(turn.api, session_id) as span:
                call = self.admission.fit_budget(await self._prompt(turn))
                version = await self._admit(call)
                return await self.runner.complete_samples(samples_of(call, turn.n), version, span)
        finally:
            slot.release()

    async def open_samples(self, turn: ChatTurn) -> tuple[TurnStarted, AsyncIterator[SampleEvent]]:
        """:meth:`open_stream` for the turn's ``n`` samples: refusals raise here; the events
        are every sample's deltas with its index, then each one's :class:`TurnDone` once all
        are durable. ``TurnStarted`` names the first sample's step."""
        self._check_samples()
        slot, call, version = await self._prepare_stream(turn)
        started = TurnStarted(call.step_id, len(call.prompt), time.time())
        events = self._stream_samples(samples_of(call, turn.n), version, slot)
        weakref.finalize(events, slot.release)
        return started, events

    async def open_stream(self, turn: ChatTurn) -> tuple[TurnStarted, AsyncIterator[TurnEvent]]:
        """Prepare a streamed turn. Refusals (overload, budget, context overflow, step limit,
        bad tool_choice, paused past the hold time) raise here, before an adapter commits to a
        200; the events are deltas as the engine samples, then :class:`TurnDone` once the step
        is durable. The turn's slot in flight is released when the stream ends, however."""
        slot, call, version = await self._prepare_stream(turn)
        started = TurnStarted(call.step_id, len(call.prompt), time.time())
        events = self._stream(call, version, slot)
        # A stream never iterated (its client left before the first event) runs no finally.
        weakref.finalize(events, slot.release)
        return started, events

    def _check_samples(self) -> None:
        """Before anything is admitted: samples are recorded together or not at all."""
        if not self.records_samples:
            raise InvalidRequest("this service records one sample per request", "n")

    async def _prepare_stream(
        self, turn: ChatTurn
    ) -> tuple[Slot, PreparedCall[ChatTurn], str | None]:
        """A streamed turn admitted (a place in flight per sample) and its prompt prepared;
        whatever refuses it releases its slot."""
        slot = self.admission.enter(turn.session.session_id, lambda: turn_number(turn), turn.n)
        try:
            call = self.admission.fit_budget(await self._prompt(turn))
            return slot, call, await self._admit(call)
        except BaseException:
            slot.release()
            raise

    async def generate_tokens(self, call: TokenCall) -> TokensResult:
        """A white-box call: the caller's prompt ids as they are, recorded like a chat turn
        (see :meth:`ingress.turns.prompts.PromptBuilder.for_tokens`)."""
        with self.tracer.call("generate", call.session.session_id) as span:
            prepared = self.prompts.for_tokens(call)  # no render: its turn is its chain's depth
            depth = prepared.parent.depth if prepared.parent else 0
            slot = self.admission.enter(call.session.session_id, lambda: depth + 1)
            try:
                prepared = self.admission.fit_budget(prepared)
                return await self.runner.tokens(prepared, await self._admit(prepared), span)
            finally:
                slot.release()

    async def _prompt(self, turn: ChatTurn) -> PreparedCall[ChatTurn]:
        """An admitted turn's prompt, its images given by URL fetched first."""
        return await self.prompts.for_turn(await self.image_urls.read(turn))

    async def _admit(self, call: AnyCall) -> str | None:
        return await self.admission.admit(call.request.session.session_id, call.parent)

    async def _stream(
        self, call: PreparedCall[ChatTurn], version: str | None, slot: Slot
    ) -> AsyncIterator[TurnEvent]:
        # The span covers the stream, not its preparation: it lives as long as the adapter reads.
        try:
            with self.tracer.call(call.request.api, call.request.session.session_id) as span:
                async for event in self.runner.stream(call, version, span):
                    yield event
        finally:  # done, failed, or closed by a client that left mid-stream
            slot.release()

    async def _stream_samples(
        self, calls: list[PreparedCall[ChatTurn]], version: str | None, slot: Slot
    ) -> AsyncIterator[SampleEvent]:
        turn = calls[0].request
        try:
            with self.tracer.call(turn.api, turn.session.session_id) as span:
                async for event in self.runner.stream_samples(calls, version, span):
                    yield event
        finally:
            slot.release()
