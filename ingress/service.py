"""The ingress core: one call from internal request to durable step. Knows no HTTP and no Kafka.

:class:`ChatService` is the surface the adapters, the session routes and ``app.py`` use; it
wires the pieces, each with its own invariant: :mod:`ingress.admission` (refusals, the pause
gate), :mod:`ingress.prompts` (the prompt from cached chains, the step id),
:mod:`ingress.generation` (the engine call, decoding and parsing), :mod:`ingress.steps` and
:mod:`ingress.recording` (the step event, published, then the chain advanced) and
:mod:`ingress.session_lifecycle` (opening and ending sessions). Chat turns and white-box calls
go through the same ones.

Invariants:
- Exact tokens: the prompt is the cached chain's tokens plus the template's continuation (TITO)
  or a full render on a cache miss; the completion is the engine's ids and logprobs, unchanged.
- A result means durable: :meth:`ChatService.complete` returns, and the stream of
  :meth:`ChatService.open_stream` yields :class:`TurnDone`, only after ``publish`` returned (the
  broker acknowledged the step). Any failure before that raises and leaves the cache as it was:
  a retry extends the same chain as a new sample with its own step id.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator

from ingress.admission import Admission, Control
from ingress.chains import ChainStore
from ingress.detokenize import Decoder
from ingress.ended_sessions import EndedSessions
from ingress.generation import (
    CallRunner,
    TokensResult,
    TokensSampled,
    TurnDone,
    TurnEvent,
    TurnResult,
    TurnStarted,
)
from ingress.prompts import AnyCall, PreparedCall, PromptBuilder, step_id_for
from ingress.recording import StepRecorder
from ingress.service_options import ServiceOptions
from ingress.session_lifecycle import SessionLifecycle
from ingress.session_log import Publish, SessionEvent
from ingress.tracing import CallTracer
from ingress.turn import ChatTurn, TokenCall
from titoflow.engine.api import Engine
from titoflow.tito.render import ChatRenderer

# What other modules import from here: the service's surface.
__all__ = [
    "ChatService",
    "ServiceOptions",
    "SessionEvent",
    "TokensResult",
    "TokensSampled",
    "TurnDone",
    "TurnEvent",
    "TurnResult",
    "TurnStarted",
    "step_id_for",
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
        tracer: CallTracer | None = None,
        control: Control | None = None,
        ended: EndedSessions | None = None,
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
        self.admission = Admission(options, control, self.ended)
        self.prompts = PromptBuilder(renderer, chains, self.admission, options)
        recorder = StepRecorder(publish, chains, renderer.end_ids)
        self.runner = CallRunner(engine, tokenizer, renderer.family, renderer.end_ids, recorder)
        # The rollout driver's session calls are the lifecycle's own.
        sessions = SessionLifecycle(publish, chains, self.ended)
        self.open_session = sessions.open_session
        self.finalize = sessions.finalize
        self.discard = sessions.discard

    async def count_prompt_tokens(self, turn: ChatTurn) -> int:
        """The conversation's prompt length, rendered in full in a worker thread (a count
        request may carry megabytes; nothing is cached for it)."""
        render = self.renderer.full_prompt
        prompt = await asyncio.to_thread(render, turn.messages, turn.tools, turn.template_kwargs)
        return len(prompt)

    async def complete(self, turn: ChatTurn) -> TurnResult:
        with self.tracer.call(turn.api, turn.session.session_id) as span:
            call = await self.prompts.for_turn(turn)
            return await self.runner.complete(call, await self._admit(call), span)

    async def open_stream(self, turn: ChatTurn) -> tuple[TurnStarted, AsyncIterator[TurnEvent]]:
        """Prepare a streamed turn. Refusals (context overflow, step limit, bad tool_choice,
        paused past the hold time) raise here, before an adapter commits to a 200; the events
        are deltas as the engine samples, then :class:`TurnDone` once the step is durable."""
        call = await self.prompts.for_turn(turn)
        version = await self._admit(call)
        started = TurnStarted(call.step_id, len(call.prompt), time.time())
        return started, self._stream(call, version)

    async def generate_tokens(self, call: TokenCall) -> TokensResult:
        """A white-box call: the caller's prompt ids as they are, recorded like a chat turn
        (see :meth:`ingress.prompts.PromptBuilder.for_tokens`)."""
        with self.tracer.call("generate", call.session.session_id) as span:
            prepared = self.prompts.for_tokens(call)
            return await self.runner.tokens(prepared, await self._admit(prepared), span)

    async def _admit(self, call: AnyCall) -> str | None:
        return await self.admission.admit(call.request.session.session_id, call.parent)

    async def _stream(
        self, call: PreparedCall[ChatTurn], version: str | None
    ) -> AsyncIterator[TurnEvent]:
        # The span covers the stream, not its preparation: it lives as long as the adapter reads.
        with self.tracer.call(call.request.api, call.request.session.session_id) as span:
            async for event in self.runner.stream(call, version, span):
                yield event
