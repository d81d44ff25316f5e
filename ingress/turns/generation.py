"""Running a prepared call on the engine, whole or streamed, and what the caller gets back.

Invariants:
- The step records the engine's tokens as they came; a chat client's text, reasoning and tool
  calls are decoded and parsed from exactly those tokens (stop strings trimmed), the same
  whether streamed or not.
- The runner records nothing: it hands back each call's :class:`Sample` (a stream yields it
  last), and the service records it (:mod:`ingress.turns.recording`) before any
  :class:`TurnResult` or :class:`TurnDone` exists.
- The ``n`` samples of one chat request are ``n`` engine calls of one prompt, run together (one,
  the ordinary case, is awaited as it is); a failure of any ends them all.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from ingress.turns.detokenize import Decoder, IncrementalDecoder, StopTrimmer
from ingress.turns.prompts import AnyCall, PreparedCall
from ingress.turns.turn import ChatTurn
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
class Sample:
    """An engine call's whole output, not yet recorded: its generation, the milliseconds the
    engine took and, for a chat turn, the output parsed from its tokens (None: white-box)."""

    generation: Generation
    engine_ms: float
    parsed: ParsedOutput | None = None


_ID_PREFIX = {"anthropic.messages": "toolu_"}


@dataclass(frozen=True)
class CallRunner:
    """Runs prepared calls on the engine and hands back what they made; recording is the
    service's."""

    engine: Engine
    tokenizer: Decoder
    family: Family
    end_ids: frozenset[int]  # the stop tokens: they end the turn, no parser reads them
    routing: RoutingKeys  # the key each call's engine is chosen by (session or instance)

    async def sample(self, calls: Sequence[PreparedCall[ChatTurn]]) -> list[Sample]:
        """The samples of one chat request (``calls``: one prompt, a step id each; one unless
        ``n`` > 1), run together, each decoded and parsed once the engine is done."""
        if len(calls) == 1:  # no task to run beside: the one call is awaited as it is
            return [await self._sample(calls[0])]
        tasks = [asyncio.ensure_future(self._sample(call)) for call in calls]
        try:
            return list(await asyncio.gather(*tasks))
        finally:  # the first failure cancels the others (their engine calls end)
            for task in tasks:
                task.cancel()

    async def _sample(self, call: PreparedCall[ChatTurn]) -> Sample:
        sample = await self.generate(call)
        parser = self._parser(call)
        trimmer = StopTrimmer(call.request.sampling.stop)
        text = self.tokenizer.decode(
            self._text_ids(sample.generation.token_ids),
            skip_special_tokens=not self.family.decode_special_tokens,
        )
        parser.feed(trimmer.push(text) + trimmer.flush())
        _, parsed = parser.finish()
        return Sample(sample.generation, sample.engine_ms, parsed)

    async def generate(self, call: AnyCall) -> Sample:
        """The whole generation, and the milliseconds the engine took; nothing decoded."""
        started = time.perf_counter()
        generation = await self.engine.generate(
            call.prompt, call.params, call.request_id, session_id=self._routing_key(call)
        )
        return Sample(generation, (time.perf_counter() - started) * 1000)

    async def stream(
        self, calls: Sequence[PreparedCall[ChatTurn]]
    ) -> AsyncIterator[tuple[int, TurnEvent | Sample]]:
        """The deltas of every sample of one chat request as the engine samples them, each
        with its index, and each sample's :class:`Sample` once it is generated. A failed
        sample ends the stream with its error (the others are cancelled)."""
        if len(calls) == 1:  # no others to interleave with: read as it comes
            async for event in self._sample_stream(calls[0]):
                yield 0, event
            return
        queue: asyncio.Queue[tuple[int, TurnEvent | Sample | Exception]] = asyncio.Queue()

        async def pump(index: int, call: PreparedCall[ChatTurn]) -> None:
            try:
                async for event in self._sample_stream(call):
                    queue.put_nowait((index, event))
            except Exception as exc:  # handed to the reader, which raises it
                queue.put_nowait((index, exc))

        tasks = [asyncio.create_task(pump(i, call)) for i, call in enumerate(calls)]
        left = len(calls)
        try:
            while left:
                index, item = await queue.get()
                if isinstance(item, Exception):
                    raise item
                left -= isinstance(item, Sample)
                yield index, item
        finally:  # done, failed, or closed by a client that left mid-stream
            for task in tasks:
                task.cancel()

    async def _sample_stream(
        self, call: PreparedCall[ChatTurn]
    ) -> AsyncIterator[OutputDelta | TokensSampled | Sample]:
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
        yield Sample(generation, engine_ms, parsed)

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
