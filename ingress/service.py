"""The ingress core: one turn from internal request to durable step. Knows no HTTP and no Kafka.

Invariants:
- Exact tokens: the prompt is the cached chain's tokens plus the template's continuation (TITO)
  or a full render on a cache miss; the completion is the engine's ids and logprobs, unchanged.
- A result means durable: :meth:`ChatService.complete` returns, and :meth:`ChatService.stream`
  yields :class:`TurnDone`, only after ``publish`` returned (the broker acknowledged the step).
  Any failure before that raises and leaves the cache as it was: a retry extends the same
  chain as a new sample with its own step id.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import sys
import time
import uuid
from array import array
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from ingress import metrics
from ingress.chains import Chain, ChainStore
from ingress.constraints import tool_call_constraint
from ingress.detokenize import IncrementalDecoder, StopTrimmer
from ingress.ended_sessions import EndedSessions
from ingress.output import OutputDelta, OutputParser, ParsedOutput
from ingress.parsers import make_parser
from ingress.tracing import CallSpan, CallTracer
from ingress.turn import ChatTurn, SessionRef, TokenCall
from schemas.events import (
    SessionDiscarded,
    SessionEnded,
    SessionFinalized,
    SessionOpened,
    SessionOptions,
    StepRecorded,
)
from schemas.routed_experts import RoutedExperts
from titoflow.engine.api import Engine, GenerateParams, Generation
from titoflow.errors import (
    ContextOverflow,
    InvalidRequest,
    SessionStepLimit,
    TrajectoryVersionChanged,
)
from titoflow.tito.messages import Matcher, Message
from titoflow.tito.render import ChatRenderer

log = logging.getLogger("titoflow.ingress")

SessionEvent = SessionOpened | StepRecorded | SessionFinalized | SessionDiscarded | SessionEnded
Publish = Callable[[SessionEvent], Awaitable[None]]


class Control(Protocol):
    """The control plane as the service sees it (:class:`ingress.control_state.PauseGate`)."""

    @property
    def version(self) -> str | None: ...

    async def admit(self) -> None: ...


class Tokenizer(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


@dataclass(frozen=True)
class ServiceOptions:
    max_model_len: int
    default_max_tokens: int
    max_tokens_cap: int = 0  # 0: no cap beyond the context window
    context_policy: Literal["clamp", "refuse"] = "clamp"
    max_steps_per_session: int = 0  # 0: no limit
    tool_parser: str = "qwen3"
    matcher: Matcher = "strict"
    vocab_size: int = 1 << 31  # token ids a white-box call may send: [0, vocab_size)
    partial_rollout: bool = True  # False: refuse a step on newer weights than its chain's first


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
class _Prepared:
    turn: ChatTurn
    parent: Chain | None
    covered: int
    tail: array[int]
    prompt: array[int]
    step_id: str
    request_id: str  # unique per attempt: vLLM aborts by request id; retries share the step id
    params: GenerateParams
    started: float  # perf_counter at the start of the turn
    render_ms: float
    version: str | None = None  # the control log's weight version when the turn was admitted


_ID_PREFIX = {"anthropic.messages": "toolu_"}


def step_id_for(
    session_id: str, parent_step_id: str | None, prompt_tail: array[int], sample: str
) -> str:
    """One id per sample: two engine calls never share one, even for the same prompt (a client
    retry, best-of-n), so neither do their tool-call ids. ``sample`` is drawn once per engine
    call; the event carries the id, so re-sends of the event and replays keep it."""
    digest = hashlib.sha256(f"{session_id}\0{parent_step_id or ''}\0{sample}\0".encode())
    digest.update(prompt_tail.tobytes())
    return digest.hexdigest()[:32]


def _new_sample(
    session_id: str, parent_step_id: str | None, prompt_tail: array[int]
) -> tuple[str, str]:
    """A new engine call's step id and engine request id: the request id is unique per attempt
    (vLLM aborts by request id) and starts with the step id."""
    sample = uuid.uuid4().hex
    step_id = step_id_for(session_id, parent_step_id, prompt_tail, sample)
    return step_id, f"{step_id}-{sample[:8]}"


def _first_new_row(prefix_len: int) -> int:
    """The first position whose routed experts no earlier step of the chain recorded: the
    parent's last token, which is first fed to the model by this step's request."""
    return max(prefix_len - 1, 0)


def _new_rows(generation: Generation, first: int) -> RoutedExperts | None:
    """Only this step's rows, also from an engine that ignored ``routed_experts_prompt_start``."""
    rows = generation.routed_experts
    return rows.between(first, rows.end) if rows else None


class ChatService:
    def __init__(
        self,
        renderer: ChatRenderer,
        tokenizer: Tokenizer,
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

    def count_prompt_tokens(self, turn: ChatTurn) -> int:
        return len(self.renderer.full_prompt(turn.messages, turn.tools, turn.template_kwargs))

    async def complete(self, turn: ChatTurn) -> TurnResult:
        with self.tracer.call(turn.api, turn.session.session_id) as span:
            prepared = await self._admitted(self._prepare(turn))
            started = time.perf_counter()
            generation = await self.engine.generate(
                prepared.prompt,
                prepared.params,
                prepared.request_id,
                session_id=turn.session.session_id,
            )
            engine_ms = (time.perf_counter() - started) * 1000
            parser = self._parser(prepared)
            trimmer = StopTrimmer(turn.sampling.stop)
            text = self.tokenizer.decode(generation.token_ids, skip_special_tokens=True)
            parser.feed(trimmer.push(text) + trimmer.flush())
            _, parsed = parser.finish()
            return await self._record(prepared, generation, parsed, engine_ms, False, span)

    async def open_stream(self, turn: ChatTurn) -> tuple[TurnStarted, AsyncIterator[TurnEvent]]:
        """Prepare a streamed turn. Refusals (context overflow, step limit, bad tool_choice,
        paused past the hold time) raise here, before an adapter commits to a 200; the events
        are deltas as the engine samples, then :class:`TurnDone` once the step is durable."""
        prepared = await self._admitted(self._prepare(turn))
        started = TurnStarted(prepared.step_id, len(prepared.prompt), time.time())
        return started, self._stream(prepared)

    async def _stream(self, prepared: _Prepared) -> AsyncIterator[TurnEvent]:
        with self.tracer.call(prepared.turn.api, prepared.turn.session.session_id) as span:
            async for event in self._stream_events(prepared, span):
                yield event

    async def _stream_events(self, prepared: _Prepared, span: CallSpan) -> AsyncIterator[TurnEvent]:
        turn = prepared.turn
        started = time.perf_counter()
        parser = self._parser(prepared)
        decoder = IncrementalDecoder(self.tokenizer)
        trimmer = StopTrimmer(turn.sampling.stop)
        ids: list[int] = []
        logprobs: list[float] = []
        top: list[list[tuple[int, float]]] = []
        finish_reason, versions, stop_reason, engine_url = "stop", [], None, self.engine.url
        routed: RoutedExperts | None = None
        async for chunk in self.engine.generate_stream(
            prepared.prompt,
            prepared.params,
            prepared.request_id,
            session_id=turn.session.session_id,
        ):
            engine_url = chunk.engine_url
            ids += chunk.token_ids
            logprobs += chunk.logprobs
            top += chunk.top_logprobs
            if chunk.token_ids:
                yield TokensSampled(chunk.token_ids, chunk.logprobs, chunk.top_logprobs)
                for delta in parser.feed(trimmer.push(decoder.push(chunk.token_ids))):
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
            request_id=prepared.request_id,
            engine_url=engine_url,
            weight_versions=versions,
            top_logprobs=top,
            stop_reason=stop_reason,
            routed_experts=routed,
        )
        yield TurnDone(await self._record(prepared, generation, parsed, engine_ms, True, span))

    def _check_step_limit(self, session_id: str, parent: Chain) -> None:
        if 0 < self.options.max_steps_per_session <= parent.depth:
            raise SessionStepLimit(
                f"session {session_id} reached its limit of "
                f"{self.options.max_steps_per_session} steps"
            )

    def _prepare(self, turn: ChatTurn) -> _Prepared:
        started = time.perf_counter()
        matcher = self.options.matcher
        found = self.chains.find(turn.session.session_id, turn.messages, turn.tools_key, matcher)
        if found:
            parent, covered = found
            self._check_step_limit(turn.session.session_id, parent)
            continuation = self.renderer.continuation(
                turn.messages,
                covered,
                parent.ends_with_terminator,
                turn.tools,
                turn.template_kwargs,
            )
            tail = array("i", continuation)
            prompt = parent.tokens + tail
        else:
            parent, covered = None, 0
            tail = array(
                "i", self.renderer.full_prompt(turn.messages, turn.tools, turn.template_kwargs)
            )
            prompt = tail
        parent_step_id = parent.head_step_id if parent else None
        step_id, request_id = _new_sample(turn.session.session_id, parent_step_id, tail)
        return _Prepared(
            turn=turn,
            parent=parent,
            covered=covered,
            tail=tail,
            prompt=prompt,
            step_id=step_id,
            request_id=request_id,
            params=self._params(turn, len(prompt), len(parent.tokens) if parent else 0),
            started=started,
            render_ms=(time.perf_counter() - started) * 1000,
        )

    async def _admitted(self, prepared: _Prepared) -> _Prepared:
        version = await self._admit(prepared.turn.session.session_id, prepared.parent)
        return replace(prepared, version=version)

    async def _admit(self, session_id: str, parent: Chain | None) -> str | None:
        """Wait while generation is paused (bounded), then check the weights the call will run
        on (a version announced during the wait counts); return their version."""
        if self.control is None:
            return None
        await self.control.admit()
        current = self.control.version
        first = parent.first_version if parent else None
        if self.options.partial_rollout or current is None or first is None or current == first:
            return current
        raise TrajectoryVersionChanged(
            f"session {session_id} started on weights {first!r}; they are now {current!r} "
            "and partial rollout is off: start a new session",
            first_version=first,
            current_version=current,
        )

    def _max_tokens(self, asked: int | None, prompt_len: int) -> int:
        """What a call may generate: asked (or the default), capped, and clamped to the room
        left in the context window (or refused, by the context policy)."""
        room = self.options.max_model_len - prompt_len
        wanted = asked or self.options.default_max_tokens
        if self.options.max_tokens_cap:
            wanted = min(wanted, self.options.max_tokens_cap)
        if room <= 0 or (self.options.context_policy == "refuse" and wanted > room):
            raise ContextOverflow(
                f"the prompt has {prompt_len} tokens and asks for {wanted} more; the model's "
                f"context is {self.options.max_model_len} tokens",
                prompt_tokens=prompt_len,
                limit=self.options.max_model_len,
            )
        return min(wanted, room)

    def _params(self, turn: ChatTurn, prompt_len: int, prefix_len: int) -> GenerateParams:
        max_tokens = self._max_tokens(turn.sampling.max_tokens, prompt_len)
        try:
            structured = tool_call_constraint(
                turn.tools, turn.tool_choice, turn.tool_choice_name, self.options.tool_parser
            )
        except ValueError as exc:
            raise InvalidRequest(str(exc), "tool_choice") from exc
        return GenerateParams(
            max_tokens=max_tokens,
            temperature=turn.sampling.temperature,
            top_p=turn.sampling.top_p,
            seed=turn.sampling.seed,
            stop_token_ids=(self.renderer.terminator_id,),
            stop=turn.sampling.stop,
            top_logprobs=turn.sampling.logprobs or 0,
            structured=structured,
            routed_experts_start=_first_new_row(prefix_len),
        )

    def _parser(self, prepared: _Prepared) -> OutputParser:
        turn = prepared.turn
        prompt_end = self.tokenizer.decode(prepared.prompt[-4:].tolist(), skip_special_tokens=False)
        return make_parser(
            self.options.tool_parser,
            prepared.step_id,
            id_prefix=_ID_PREFIX.get(turn.api, "call_"),
            tools=turn.tools,
            parse_tools=bool(turn.tools) and turn.tool_choice != "none",
            reasoning_open=prompt_end.rstrip("\n").endswith("<think>"),
        )

    async def _record(
        self,
        prepared: _Prepared,
        generation: Generation,
        parsed: ParsedOutput,
        engine_ms: float,
        stream: bool,
        span: CallSpan,
    ) -> TurnResult:
        turn, parent = prepared.turn, prepared.parent
        answer = Message(
            role="assistant",
            content=parsed.content,
            reasoning=parsed.reasoning,
            tool_calls=tuple(parsed.tool_calls),
        )
        step = StepRecorded(
            session_id=turn.session.session_id,
            event_time=time.time(),
            step_id=prepared.step_id,
            chain_id=parent.chain_id if parent else prepared.step_id,
            parent_step_id=parent.head_step_id if parent else None,
            prefix="tito" if parent else "rendered",
            prefix_len=len(parent.tokens) if parent else 0,
            prompt_tail_ids=prepared.tail.tolist(),
            completion_ids=generation.token_ids,
            completion_logprobs=generation.logprobs,
            weight_versions=generation.weight_versions,
            finish_reason=generation.finish_reason,
            instance_id=turn.session.instance_id,
            turn_id=turn.session.turn_id,
            api=turn.api,
            stream=stream,
            matcher=self.options.matcher,
            model=turn.model,
            engine_url=generation.engine_url,
            engine_request_id=generation.request_id,
            new_messages=[m.template_dict() for m in turn.messages[prepared.covered :]],
            response_message=answer.template_dict(),
            tool_parse_error=parsed.parse_error,
            tools_hash=_tools_hash(turn.tools_key),
            # What a worker needs to re-render the chain; its TITO steps share them.
            tools=list(turn.tools) if parent is None else [],
            template_kwargs=dict(turn.template_kwargs) if parent is None else {},
            constrained=prepared.params.structured is not None,
            routed_experts=_new_rows(generation, prepared.params.routed_experts_start),
            render_ms=prepared.render_ms,
            engine_ms=engine_ms,
        )
        await self.publish(step)
        self._observe(step, len(prepared.prompt), prepared.started, span)

        completion = array("i", generation.token_ids)
        self.chains.advance(
            turn.session.session_id,
            parent,
            Chain(
                chain_id=step.chain_id,
                tools_key=turn.tools_key,
                # Clients rarely echo reasoning (and no matcher compares it): kept without it,
                # the echo matches field for field, the cheap way (see ChainStore.find).
                messages=(*turn.messages, answer.model_copy(update={"reasoning": None})),
                tokens=prepared.prompt + completion,
                head_step_id=step.step_id,
                ends_with_terminator=bool(completion)
                and completion[-1] == self.renderer.terminator_id,
                depth=parent.depth + 1 if parent else 1,
                first_version=parent.first_version if parent else prepared.version,
                prior=parent.summary() if parent else None,
            ),
        )
        return TurnResult(step, parsed, generation, len(prepared.prompt))

    def _observe(self, step: StepRecorded, prompt_len: int, started: float, span: CallSpan) -> None:
        """The span's attributes now; metrics and the log line once the answer is on its way
        (the next loop iteration, 0.1 ms sooner for the client): it waits for none of them."""
        span.recorded(step, prompt_len)
        asyncio.get_running_loop().call_soon(self._count, step, prompt_len, started)

    def _count(self, step: StepRecorded, prompt_len: int, started: float) -> None:
        """Metrics and the log line of a recorded step, whose turn ends now."""
        metrics.STEPS.labels(step.api, step.prefix).inc()
        if step.tool_parse_error:
            metrics.TOOL_PARSE_ERRORS.labels(step.api).inc()
        metrics.TOKENS.labels("prompt").inc(prompt_len)
        metrics.TOKENS.labels("completion").inc(len(step.completion_ids))
        turn_seconds = time.perf_counter() - started
        metrics.TURN_SECONDS.labels(step.api).observe(turn_seconds)
        metrics.OVERHEAD_SECONDS.labels(step.api).observe(turn_seconds - step.engine_ms / 1000)
        log.info(
            "step recorded",
            extra={
                "session_id": step.session_id,
                "step_id": step.step_id,
                "prefix": step.prefix,
                "prompt_tokens": prompt_len,
                "completion_tokens": len(step.completion_ids),
                "tool_parse_error": step.tool_parse_error,
            },
        )

    async def generate_tokens(self, call: TokenCall) -> TokensResult:
        """A white-box call: the caller's prompt ids as they are, recorded like a chat turn.

        A prompt that starts with a cached chain's tokens extends that chain (``prefix: tito``,
        the rest is the prompt tail); otherwise the whole prompt is the tail of a new chain
        (``rendered``), which workers place as they place any cache miss.
        """
        session_id = call.session.session_id
        with self.tracer.call("generate", session_id) as span:
            started = time.perf_counter()
            prompt = array("i", call.prompt_ids)
            parent = self.chains.find_tokens(session_id, prompt)
            if parent is not None:
                self._check_step_limit(session_id, parent)
            covered = len(parent.tokens) if parent else 0
            tail = prompt[covered:]
            step_id, request_id = _new_sample(
                session_id, parent.head_step_id if parent else None, tail
            )
            params = GenerateParams(
                max_tokens=self._max_tokens(call.max_tokens, len(prompt)),
                temperature=call.temperature,
                top_p=call.top_p,
                seed=call.seed,
                stop_token_ids=call.stop_token_ids,
                top_logprobs=call.top_logprobs,
                routed_experts_start=_first_new_row(covered),
            )
            version = await self._admit(session_id, parent)
            engine_started = time.perf_counter()
            generation = await self.engine.generate(
                prompt,
                params,
                request_id,
                session_id=session_id,
            )
            step = StepRecorded(
                session_id=session_id,
                event_time=time.time(),
                step_id=step_id,
                chain_id=parent.chain_id if parent else step_id,
                parent_step_id=parent.head_step_id if parent else None,
                prefix="tito" if parent else "rendered",
                prefix_len=covered,
                prompt_tail_ids=tail.tolist(),
                completion_ids=generation.token_ids,
                completion_logprobs=generation.logprobs,
                weight_versions=generation.weight_versions,
                finish_reason=generation.finish_reason,
                instance_id=call.session.instance_id,
                turn_id=call.session.turn_id,
                api="generate",
                model=call.model,
                engine_url=generation.engine_url,
                engine_request_id=generation.request_id,
                new_messages=[],
                response_message={},
                tools_hash=_tools_hash(parent.tools_key) if parent else "",
                routed_experts=_new_rows(generation, params.routed_experts_start),
                render_ms=0.0,
                engine_ms=(time.perf_counter() - engine_started) * 1000,
            )
            await self.publish(step)
            self._observe(step, len(prompt), started, span)
            completion = array("i", generation.token_ids)
            self.chains.advance_tokens(
                session_id,
                parent,
                Chain(
                    chain_id=step.chain_id,
                    tools_key=parent.tools_key if parent else "",
                    messages=(),  # set by advance_tokens
                    tokens=prompt + completion,
                    head_step_id=step_id,
                    ends_with_terminator=bool(completion)
                    and completion[-1] == self.renderer.terminator_id,
                    depth=parent.depth + 1 if parent else 1,
                    first_version=parent.first_version if parent else version,
                ),
            )
            return TokensResult(step, generation, len(prompt))

    async def open_session(
        self,
        session: SessionRef,
        channel: str | None,
        metadata: dict[str, Any],
        options: SessionOptions,
    ) -> SessionOpened:
        event = SessionOpened(
            session_id=session.session_id,
            event_time=time.time(),
            instance_id=session.instance_id,
            channel=channel,
            metadata=metadata,
            options=options,
        )
        await self.publish(event)
        return event

    async def finalize(
        self,
        session: SessionRef,
        metadata: dict[str, Any],
        reward: float | None = None,
        reward_components: dict[str, float] | None = None,
    ) -> SessionFinalized:
        event = SessionFinalized(
            session_id=session.session_id,
            event_time=time.time(),
            reward=reward,
            reward_components=reward_components or {},
            metadata=metadata,
        )
        await self._end(event, "finalized")
        return event

    async def discard(self, session: SessionRef, metadata: dict[str, Any]) -> SessionDiscarded:
        event = SessionDiscarded(
            session_id=session.session_id, event_time=time.time(), metadata=metadata
        )
        await self._end(event, "discarded")
        return event

    async def _end(
        self, event: SessionFinalized | SessionDiscarded, how: Literal["finalized", "discarded"]
    ) -> None:
        """End a session once: refused if it already ended (here or on any replica that
        published it); the end goes to the session's log, then to ``<prefix>.ended``."""
        end = SessionEnded(session_id=event.session_id, event_time=event.event_time, how=how)
        self.ended.claim(end)
        try:
            await self.publish(event)
        except BaseException:
            self.ended.release(end)  # nothing ended: the driver's retry must be let through
            raise
        self.chains.forget(event.session_id)
        # The session did end (workers will apply it); a failure here is the driver's cue to
        # retry, which this replica answers with 409 and another one with a dead letter.
        await self.publish(end)


def _tools_hash(tools_key: str) -> str:
    return hashlib.sha256(tools_key.encode()).hexdigest()[:16]
