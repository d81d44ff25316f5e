"""Running a prepared call on the engine, whole or streamed, and what the caller gets back.

Invariants:
- The step records the engine's tokens as they came; a chat client's text, reasoning and tool
  calls are decoded and parsed from exactly those tokens (stop strings trimmed), the same
  whether streamed or not.
- A result exists only once its step is recorded: :class:`TurnResult` and :class:`TokensResult`
  are returned, and a stream yields :class:`TurnDone`, only after the step was published.
- The ``n`` samples of one chat request are ``n`` engine calls of one prompt, run together; their
  steps are published only once every sample was generated, and none is answered unless all
  were published (:meth:`~ingress.turns.recording.StepRecorder.record_samples`): an engine failure
  of any sample records none of them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass

from ingress.turns.detokenize import Decoder, IncrementalDecoder, StopTrimmer
from ingress.turns.prompts import AnyCall, PreparedCall
from ingress.turns.recording import StepRecorder
from ingress.turns.tracing import CallSpan
from ingress.turns.turn import ChatTurn, TokenCall
from schemas.events import StepRecorded
from schemas.routed_experts import RoutedExperts
from titoflow.engine.api import Engine, Generation
from titoflow.engine.groups import RoutingKeys
from titoflow.tito.families.base import Family, ParserOptions
from titoflow.tito.output import OutputDelta, OutputParser, ParsedOutput


@dataclass(frozen=True)
class TurnResult:
    step: StepRecorded
    parsed: ParsedOutput
    generation: Generation
    prompt_len: int


@dataclass(frozen=True)
class TokensResult:
    """A white-box call's answer: the step as recorded and the engine's generation."""

    step: StepRecorded
    generation: Generation
    prompt_len: int


@dataclass(frozen=True)
class TurnStarted:
    """What an adapter's opening stream event needs, known before any token is sampled."""

    step_id: str
    prompt_len: int
    created: float


@dataclass(frozen=True)
class TokensSampled:
    """Tokens as they arrive, before their text: for adapters that return logprobs."""

    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]


@dataclass(frozen=True)
class TurnDone:
    result: TurnResult


TurnEvent = OutputDelta | TokensSampled | TurnDone


@dataclass(frozen=True)
class SampleEvent:
    """An event of one of a request's ``n`` samples; ``index`` is its choice."""

    index: int
    event: TurnEvent


@dataclass(frozen=True)
class _Sampled:
    """A chat sample's whole output, not yet recorded: a sample stream's last item."""

    generation: Generation
    parsed: ParsedOutput
    engine_ms: float


async def _all(samples: Sequence[Awaitable[_Sampled]]) -> list[_Sampled]:
    """Every sample, or the first failure with the others cancelled (their engine calls end)."""
    tasks = [asyncio.ensure_future(sample) for sample in samples]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()


_ID_PREFIX = {"anthropic.messages": "toolu_"}


@dataclass(frozen=True)
class CallRunner:
    engine: Engine
    tokenizer: Decoder
    family: Family
    end_ids: frozenset[int]  # the stop tokens: they end the turn, no parser reads them
    recorder: StepRecorder
    routing: RoutingKeys  # the key each call's engine is chosen by (session or instance)

    async def complete(
        self, call: PreparedCall[ChatTurn], version: str | None, span: CallSpan
    ) -> TurnResult:
        """A chat turn answered at once: its text decoded and parsed when the engine is done."""
        sampled = await self._sample(call)
        generation, parsed = sampled.generation, sampled.parsed
        step = await self.recorder.record(
            call, version, generation, sampled.engine_ms, span, parsed
        )
        return TurnResult(step, parsed, generation, len(call.prompt))

    async def complete_samples(
        self, calls: Sequence[PreparedCall[ChatTurn]], version: str | None, span: CallSpan
    ) -> list[TurnResult]:
        """The samples of one chat request (``calls``: one prompt, a step id each), answered
        together once all are generated and recorded."""
        sampled = await _all([self._sample(call) for call in calls])
        return await self._record_samples(calls, sampled, version, span, stream=False)

    async def _sample(self, call: PreparedCall[ChatTurn]) -> _Sampled:
        generation, engine_ms = await self._generate(call)
        parser = self._parser(call)
        trimmer = StopTrimmer(call.request.sampling.stop)
        text = self.tokenizer.decode(
            self._text_ids(generation.token_ids),
            skip_special_tokens=not self.family.decode_special_tokens,
        )
        parser.feed(trimmer.push(text) + trimmer.flush())
        _, parsed = parser.finish()
        return _Sampled(generation, parsed, engine_ms)

    async def _record_samples(
        self,
        calls: Sequence[PreparedCall[ChatTurn]],
        sampled: Sequence[_Sampled],
        version: str | None,
        span: CallSpan,
        stream: bool,
    ) -> list[TurnResult]:
        outputs = [
            (call, s.generation, s.engine_ms, s.parsed)
            for call, s in zip(calls, sampled, strict=True)
        ]
        steps = await self.recorder.record_samples(outputs, version, span, stream)
        return [
            TurnResult(step, s.parsed, s.generation, len(call.prompt))
            for call, s, step in zip(calls, sampled, steps, strict=True)
        ]

    async def tokens(
        self, call: PreparedCall[TokenCall], version: str | None, span: CallSpan
    ) -> TokensResult:
        """A white-box call: token ids in and out, nothing decoded."""
        generation, engine_ms = await self._generate(call)
        step = await self.recorder.record(call, version, generation, engine_ms, span)
        return TokensResult(step, generation, len(call.prompt))

    async def stream(
        self, call: PreparedCall[ChatTurn], version: str | None, span: CallSpan
    ) -> AsyncIterator[TurnEvent]:
        """Deltas as the engine samples, then :class:`TurnDone` once the step is durable."""
        async for event in self._sample_stream(call):
            if isinstance(event, _Sampled):
                generation, parsed = event.generation, event.parsed
                step = await self.recorder.record(
                    call, version, generation, event.engine_ms, span, parsed, stream=True
                )
                yield TurnDone(TurnResult(step, parsed, generation, len(call.prompt)))
            else:
                yield event

    async def stream_samples(
        self, calls: Sequence[PreparedCall[ChatTurn]], version: str | None, span: CallSpan
    ) -> AsyncIterator[SampleEvent]:
        """The deltas of every sample of one chat request as the engine samples them, each
        with its index; then, once all are generated and recorded, each one's
        :class:`TurnDone`. A failed sample ends the stream with its error (the others are
        cancelled, nothing is recorded)."""
        queue: asyncio.Queue[tuple[int, TurnEvent | _Sampled | Exception]] = asyncio.Queue()

        async def pump(index: int, call: PreparedCall[ChatTurn]) -> None:
            try:
                async for event in self._sample_stream(call):
                    queue.put_nowait((index, event))
            except Exception as exc:  # handed to the reader, which raises it
                queue.put_nowait((index, exc))

        tasks = [asyncio.create_task(pump(i, call)) for i, call in enumerate(calls)]
        sampled: dict[int, _Sampled] = {}
        try:
            while len(sampled) < len(calls):
                index, event = await queue.get()
                if isinstance(event, Exception):
                    raise event
                if isinstance(event, _Sampled):
                    sampled[index] = event
                else:
                    yield SampleEvent(index, event)
        finally:  # done, failed, or closed by a client that left mid-stream
            for task in tasks:
                task.cancel()
        ordered = [sampled[i] for i in range(len(calls))]
        results = await self._record_samples(calls, ordered, version, span, stream=True)
        for index, result in enumerate(results):
            yield SampleEvent(index, TurnDone(result))

    async def _sample_stream(
        self, call: PreparedCall[ChatTurn]
    ) -> AsyncIterator[OutputDelta | TokensSampled | _Sampled]:
        """A sample's deltas as the engine samples, then its whole output, unrecorded."""
        turn = call.request
        started = time.perf_counter()
        parser = self._parser(call)
        decoder = IncrementalDecoder(self.tokenizer, self.family.decode_special_tokens)
        trimmer = StopTrimmer(turn.sampling.stop)
        ids: list[int] = []
        logprobs: list[float] = []
        top: list[list[tuple[int, float]]] = []
        finish_reason, versions, stop_reason, engine_url = "stop", [], None, self.engine.url
        routed: RoutedExperts | None = None
        async for chunk in self.engine.generate_stream(
            call.prompt,
            call.params,
            call.request_id,
            session_id=self._routing_key(call),
        ):
            engine_url = chunk.engine_url
            ids += chunk.token_ids
            logprobs += chunk.logprobs
            top += chunk.top_logprobs
            if chunk.token_ids:
                yield TokensSampled(chunk.token_ids, chunk.logprobs, chunk.top_logprobs)
                new_text = decoder.push(self._text_ids(chunk.token_ids))
                for delta in parser.feed(trimmer.push(new_text)):
                    yield delta
            if chunk.finish_reason is not None:
                finish_reason, versions = chunk.finish_reason, chunk.weight_versions
                stop_reason, routed = chunk.stop_reason, chunk.routed_experts
        engine_ms = (time.perf_counter() - started) * 1000
        for delta in parser.feed(trimmer.push(decoder.flush()) + trimmer.flush()):
            yield delta
        last, parsed = parser.finish()
        for delta in last:
            yield delta
        generation = Generation(
            token_ids=ids,
            logprobs=logprobs,
            finish_reason=finish_reason,
            request_id=call.request_id,
            engine_url=engine_url,
            weight_versions=versions,
            top_logprobs=top,
            stop_reason=stop_reason,
            routed_experts=routed,
        )
        yield _Sampled(generation, parsed, engine_ms)

    async def _generate(self, call: AnyCall) -> tuple[Generation, float]:
        """The whole generation, and the milliseconds the engine took."""
        started = time.perf_counter()
        generation = await self.engine.generate(
            call.prompt, call.params, call.request_id, session_id=self._routing_key(call)
        )
        return generation, (time.perf_counter() - started) * 1000

    def _routing_key(self, call: AnyCall) -> str:
        session = call.request.session
        return self.routing.key(session.session_id, session.instance_id)

    def _text_ids(self, token_ids: list[int]) -> list[int]:
        """The ids whose text the client sees: a stop token ends a generation and is no text."""
        return token_ids[:-1] if token_ids and token_ids[-1] in self.end_ids else token_ids

    def _parser(self, call: PreparedCall[ChatTurn]) -> OutputParser:
        turn = call.request
        prompt_end = self.tokenizer.decode(call.prompt[-4:].tolist(), skip_special_tokens=False)
        options = ParserOptions(
            step_id=call.step_id,
            id_prefix=_ID_PREFIX.get(turn.api, "call_"),
            tools=turn.tools,
            parse_tools=bool(turn.tools) and turn.tool_choice != "none",
            reasoning_open=self.family.reasoning_open(prompt_end),
        )
        return self.family.parser(options)
