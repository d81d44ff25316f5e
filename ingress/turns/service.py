"""The ingress core: one call from internal request to durable step. Knows no HTTP and no Kafka.

:class:`ChatService` is the surface the adapters, the session routes and ``app.py`` use. A turn
reads top-down in :meth:`ChatService.complete`, in phases, each a piece with its own invariant:
enter, fit and admit (:mod:`ingress.turns.admission`: refusals, the pause gate), the prompt
(:mod:`ingress.turns.image_urls`, then :mod:`ingress.turns.prompts`: cached chains, step ids),
the engine (:mod:`ingress.turns.generation`: it returns the samples, decoded and parsed), the
record (:mod:`ingress.turns.recording`: the step events published, then the chains advanced).
A turn of ``n`` samples is the same path with ``n`` engine calls; white-box calls go through
the same pieces; :mod:`ingress.turns.session_lifecycle` opens and ends sessions.

Invariants:
- Exact tokens: the prompt is the cached chain's tokens plus the template's continuation (TITO)
  or a full render on a cache miss; the completion is the engine's ids and logprobs, unchanged.
- A result means durable: :meth:`ChatService.complete` returns, and the stream of
  :meth:`ChatService.open_stream` yields :class:`TurnDone`, only after the broker acknowledged
  the turn's steps (every sample's, published together). Any failure before that raises and
  leaves the cache as it was: a retry extends the same chain as a new sample with its own step
  id.
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
    Sample,
    SampleEvent,
    TokensResult,
    TokensSampled,
    TurnDone,
    TurnEvent,
    TurnResult,
    TurnStarted,
)
from ingress.turns.image_urls import ImageUrls
from ingress.turns.prompts import PreparedCall, PromptBuilder, samples_of
from ingress.turns.recording import StepRecorder
from ingress.turns.service_options import ServiceOptions
from ingress.turns.session_lifecycle import SessionLifecycle
from ingress.turns.session_log import Publish, PublishTogether, SessionEvent
from ingress.turns.tracing import CallTracer
from ingress.turns.turn import ChatTurn, TokenCall
from ingress.turns.turn_images import check_images, has_images
from schemas.events import StepRecorded
from titoflow.engine.api import Engine
from titoflow.engine.groups import RoutingKeys
from titoflow.errors import InvalidRequest
from titoflow.tito.prompt_images import IMAGE_PAD, expand
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
        self.prompts = PromptBuilder(renderer, chains, options)
        self.image_urls = ImageUrls(options, renderer.token_id(IMAGE_PAD))
        self.recorder = StepRecorder(
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
        self.runner = CallRunner(engine, tokenizer, renderer.family, renderer.end_ids, self.routing)
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

    async def complete(self, turn: ChatTurn) -> list[TurnResult]:
        """A turn answered whole: its samples (one unless ``n`` > 1, of one prompt rendered
        once, each its own step), returned once every step is durable."""
        slot = self._enter(turn)  # 1. enter: budget, a place in flight per sample, open session
        try:
            with self.tracer.call(turn.api, turn.session.session_id) as span:
                calls, version = await self._prepare(turn)  # 2-3. prompt, fit, admit
                samples = await self.runner.sample(calls)  # 4. the engine
                steps = await self.recorder.record(calls, samples, version, span)  # 5. durable
                return _results(calls, samples, steps)
        finally:
            slot.release()

    async def open_stream(self, turn: ChatTurn) -> tuple[TurnStarted, AsyncIterator[SampleEvent]]:
        """Prepare a streamed turn. Refusals (overload, budget, context overflow, step limit,
        bad tool_choice, paused past the hold time) raise here, before an adapter commits to a
        200; the events are each sample's deltas (with its index) as the engine samples, then
        each one's :class:`TurnDone` once all are durable. ``TurnStarted`` names the first
        sample's step. The turn's slot in flight is released when the stream ends, however."""
        slot = self._enter(turn)
        try:
            calls, version = await self._prepare(turn)
        except BaseException:
            slot.release()
            raise
        started = TurnStarted(calls[0].step_id, len(calls[0].prompt), time.time())
        events = self._stream(calls, version, slot)
        # A stream never iterated (its client left before the first event) runs no finally.
        weakref.finalize(events, slot.release)
        return started, events

    async def generate_tokens(self, call: TokenCall) -> TokensResult:
        """A white-box call: the caller's prompt ids as they are, recorded like a chat turn
        (see :meth:`ingress.turns.prompts.PromptBuilder.for_tokens`)."""
        with self.tracer.call("generate", call.session.session_id) as span:
            prepared = self.prompts.for_tokens(call)  # no render: its turn is its chain's depth
            depth = prepared.parent.depth if prepared.parent else 0
            slot = self.admission.enter(call.session.session_id, lambda: depth + 1)
            try:
                prepared = self.admission.fit(prepared)
                version = await self.admission.admit(prepared)
                sample = await self.runner.generate(prepared)
                [step] = await self.recorder.record([prepared], [sample], version, span)
                return TokensResult(step, sample.generation, len(prepared.prompt))
            finally:
                slot.release()

    def _enter(self, turn: ChatTurn) -> Slot:
        if turn.n > 1 and not self.records_samples:  # recorded together or not at all
            raise InvalidRequest("this service records one sample per request", "n")
        return self.admission.enter(turn.session.session_id, lambda: turn_number(turn), turn.n)

    async def _prepare(self, turn: ChatTurn) -> tuple[list[PreparedCall[ChatTurn]], str | None]:
        """The turn's prompt (its images given by URL fetched first), fitted and admitted, as
        its ``n`` engine calls; and the weight version they were admitted under."""
        call = self.admission.fit(await self.prompts.for_turn(await self.image_urls.read(turn)))
        version = await self.admission.admit(call)
        return samples_of(call, turn.n), version

    async def _stream(
        self, calls: list[PreparedCall[ChatTurn]], version: str | None, slot: Slot
    ) -> AsyncIterator[SampleEvent]:
        # The span covers the stream, not its preparation: it lives as long as the adapter reads.
        turn = calls[0].request
        try:
            with self.tracer.call(turn.api, turn.session.session_id) as span:
                samples: dict[int, Sample] = {}
                async for index, event in self.runner.stream(calls):
                    if isinstance(event, Sample):
                        samples[index] = event
                    else:
                        yield SampleEvent(index, event)
                ordered = [samples[i] for i in range(len(calls))]
                steps = await self.recorder.record(calls, ordered, version, span, stream=True)
                for index, result in enumerate(_results(calls, ordered, steps)):
                    yield SampleEvent(index, TurnDone(result))
        finally:  # done, failed, or closed by a client that left mid-stream
            slot.release()


def _results(
    calls: list[PreparedCall[ChatTurn]], samples: list[Sample], steps: list[StepRecorded]
) -> list[TurnResult]:
    results = []
    for call, sample, step in zip(calls, samples, steps, strict=True):
        assert sample.parsed is not None, "a chat turn's samples are parsed"
        results.append(TurnResult(step, sample.parsed, sample.generation, len(call.prompt)))
    return results
