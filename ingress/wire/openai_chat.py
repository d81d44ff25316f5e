"""OpenAI ``/v1/chat/completions`` ⇄ the internal turn model. Wire shapes end here.

Invariant: a streamed completion and a whole one of the same turn are the same message (text,
reasoning, tool calls, finish reason); logprob entries reach a stream with the first chunk
after their tokens were sampled, so they never run ahead of the text they belong to. With
``n`` > 1 each choice is one sample (its own step), at the index of its sample, streamed or not.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import Field, InstanceOf, RootModel

from ingress.turns.chains import MAX_CHAINS_PER_SESSION
from ingress.turns.service import (
    SampleEvent,
    TokensSampled,
    TurnDone,
    TurnEvent,
    TurnResult,
    TurnStarted,
)
from ingress.turns.turn import ChatTurn, SamplingOptions, SessionRef
from ingress.wire import errors, http, sse
from ingress.wire.adapter import (
    TextPart,
    ToolName,
    TurnApi,
    content_with_images,
    has_image,
    text_of,
    token_counts,
)
from ingress.wire.known_messages import KNOWN_MESSAGES
from titoflow.errors import InvalidRequest
from titoflow.tito.messages import Message, MessageImage, messages_from_fields
from titoflow.tito.output import ReasoningDelta, TextDelta, ToolCallDone


class _Function(http.Lenient):
    name: str
    arguments: str | dict[str, Any] = "{}"


class _ToolCall(http.Lenient):
    id: str
    type: Literal["function"] = "function"
    function: _Function


class _Message(http.Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    reasoning_content: str | None = None
    tool_calls: list[_ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class _FunctionSpec(http.Lenient):
    name: ToolName
    description: str | None = None
    # Only its type: a schema is the template's to read, and copying it is a third of this
    # check's cost (docs/benchmarks.md §9).
    parameters: InstanceOf[dict] | None = None  # type: ignore[type-arg]


class _Tool(http.Lenient):
    type: Literal["function"]
    function: _FunctionSpec


class _Tools(RootModel[list[_Tool]]):
    """The request's tools, checked in one call; the template takes them as they came."""


class _NamedChoice(http.Lenient):
    type: Literal["function"] = "function"
    function: dict[str, str]


class _StreamOptions(http.Lenient):
    include_usage: bool = False


class ChatCompletionRequest(http.Lenient):
    model: str
    # Each validated on its own as a _Message, once per replica (see ingress.wire.known_messages).
    messages: list[Any] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["auto", "none", "required"] | _NamedChoice | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    # Each sample becomes a cached chain the client may continue: no more than a session keeps.
    n: int = Field(1, ge=1, le=MAX_CHAINS_PER_SESSION)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    stream: bool = False
    stream_options: _StreamOptions | None = None
    chat_template_kwargs: dict[str, Any] | None = None


_TEXT_PARTS = frozenset({"text", "input_text"})


def _message_fields(raw: _Message, at: str) -> dict[str, Any]:
    content = raw.content
    images: tuple[MessageImage, ...] = ()
    if isinstance(content, list) and has_image(content, "image_url"):
        if raw.role not in ("user", "tool"):
            raise InvalidRequest(f"{at}: only user and tool messages may hold images", at)
        text, images = content_with_images(content, _TEXT_PARTS, f"{at}.content", "image_url")
    else:
        text = text_of(content, _TEXT_PARTS, "messages")
    fields: dict[str, Any] = {
        "role": "system" if raw.role == "developer" else raw.role,
        "content": text,
        "reasoning": raw.reasoning_content,
        "tool_calls": [
            {
                "id": call.id,
                "name": call.function.name,
                "arguments": call.function.arguments
                if isinstance(call.function.arguments, str)
                else json.dumps(call.function.arguments),
            }
            for call in raw.tool_calls or ()
        ],
        "tool_call_id": raw.tool_call_id,
        "name": raw.name,
    }
    if images:
        fields["images"] = images
    return fields


def _parse_new(new: list[tuple[int, Any]]) -> list[tuple[Message, ...]]:
    fields = [
        _message_fields(http.validated(_Message, raw, f"messages.{i}"), f"messages.{i}")
        for i, raw in new
    ]
    return [(message,) for message in messages_from_fields(fields)]


def parse_request(body: Any, session: SessionRef) -> tuple[ChatTurn, ChatCompletionRequest]:
    """Validate a chat.completions body into a turn of ``session``."""
    request = http.validated(ChatCompletionRequest, body)
    if request.tools:
        http.validated(_Tools, request.tools, "tools")
    choice = request.tool_choice
    named = choice.function.get("name") if isinstance(choice, _NamedChoice) else None
    known = KNOWN_MESSAGES.parse_turn("openai.chat", request.messages, _parse_new)
    turn = ChatTurn(
        session=session,
        api="openai.chat",
        model=request.model,
        messages=known.messages,
        text_only=known.text_only,
        tools=tuple(request.tools or ()),
        tool_choice="named" if named else (choice if isinstance(choice, str) else "auto"),
        tool_choice_name=named,
        sampling=SamplingOptions(
            max_tokens=request.max_completion_tokens or request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed,
            stop=(request.stop,) if isinstance(request.stop, str) else tuple(request.stop or ()),
            logprobs=(request.top_logprobs or 0) if request.logprobs else None,
        ),
        n=request.n,
        template_kwargs=request.chat_template_kwargs or {},
    )
    return turn, request


_FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "stop"}


def _finish_reason(result: TurnResult) -> str:
    if result.parsed.tool_calls:
        return "tool_calls"
    return _FINISH_REASONS.get(result.generation.finish_reason, "stop")


def _usage(*results: TurnResult) -> dict[str, int]:
    """Every sample's completion tokens, the prompt they share once."""
    prompt = token_counts(results[0])[0]
    completion = sum(token_counts(result)[1] for result in results)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


class _Logprobs:
    """OpenAI logprob entries (token text, logprob, bytes, top alternatives) from token ids."""

    def __init__(self, request: Request, top: int) -> None:
        self.tokenizer = http.service(request).tokenizer
        self.top = top

    def _entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        text = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    def content(
        self, ids: list[int], logprobs: list[float], alternatives: list[list[tuple[int, float]]]
    ) -> list[dict[str, Any]]:
        entries = []
        for index, (token_id, logprob) in enumerate(zip(ids, logprobs, strict=True)):
            entry = self._entry(token_id, logprob)
            ranked = sorted(
                alternatives[index] if index < len(alternatives) else [], key=lambda a: -a[1]
            )
            unique = dict(ranked)  # the engine lists the sampled token first, then the top k
            entry["top_logprobs"] = [
                self._entry(alt_id, alt_lp) for alt_id, alt_lp in list(unique.items())[: self.top]
            ]
            entries.append(entry)
        return entries


def _logprobs(request: Request, turn: ChatTurn, raw: ChatCompletionRequest) -> _Logprobs | None:
    return _Logprobs(request, turn.sampling.logprobs or 0) if raw.logprobs else None


def _choice(result: TurnResult, index: int, logprobs: _Logprobs | None) -> dict[str, Any]:
    parsed = result.parsed
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content or None}
    if parsed.reasoning is not None:
        message["reasoning_content"] = parsed.reasoning
    if parsed.tool_calls:
        message["tool_calls"] = [c.function_call(parsed_arguments=False) for c in parsed.tool_calls]
    generation = result.generation
    choice_logprobs = (
        {
            "content": logprobs.content(
                generation.token_ids, generation.logprobs, generation.top_logprobs
            )
        }
        if logprobs
        else None
    )
    return {
        "index": index,
        "message": message,
        "finish_reason": _finish_reason(result),
        "logprobs": choice_logprobs,
    }


def completion_response(
    results: list[TurnResult], model: str, logprobs: _Logprobs | None
) -> dict[str, Any]:
    """The completion of a turn's samples, a choice each (one unless ``n`` > 1), named by the
    first one's step."""
    first = results[0].step
    return {
        "id": f"chatcmpl-{first.step_id}",
        "object": "chat.completion",
        "created": int(first.event_time),
        "model": model,
        "choices": [_choice(result, i, logprobs) for i, result in enumerate(results)],
        "usage": _usage(*results),
    }


def _whole(
    request: Request, turn: ChatTurn, raw: ChatCompletionRequest, results: list[TurnResult]
) -> dict[str, Any]:
    return completion_response(results, turn.model, _logprobs(request, turn, raw))


class _Chunks:
    """One streamed completion's chunks. Logprob entries wait for the next chunk: tokens are
    sampled before their text is known (a detokenizer or parser may hold it back)."""

    def __init__(
        self,
        turn: ChatTurn,
        started: TurnStarted,
        include_usage: bool,
        logprobs: _Logprobs | None,
        index: int = 0,
    ) -> None:
        self.base: dict[str, Any] = {
            "id": f"chatcmpl-{started.step_id}",
            "object": "chat.completion.chunk",
            "created": int(started.created),
            "model": turn.model,
        }
        self.include_usage = include_usage
        self.logprobs = logprobs
        self.index = index  # the choice: the sample's index
        self.pending: list[dict[str, Any]] = []  # logprob entries not yet attached to a chunk

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": self.index, "delta": delta, "finish_reason": finish}
        if self.logprobs is not None:
            choice["logprobs"] = {"content": self.pending.copy()} if self.pending else None
            self.pending.clear()
        return {**self.base, "choices": [choice]}

    def opening(self) -> tuple[dict[str, Any], ...]:
        return (self._chunk({"role": "assistant", "content": ""}),)

    def render(self, event: TurnEvent) -> tuple[dict[str, Any], ...]:
        if isinstance(event, TokensSampled):
            if self.logprobs is not None:
                self.pending.extend(
                    self.logprobs.content(event.token_ids, event.logprobs, event.top_logprobs)
                )
            return ()
        if isinstance(event, TextDelta):
            return (self._chunk({"content": event.text}),)
        if isinstance(event, ReasoningDelta):
            return (self._chunk({"reasoning_content": event.text}),)
        if isinstance(event, ToolCallDone):
            call = event.call.function_call(parsed_arguments=False)
            return (self._chunk({"tool_calls": [{"index": event.index, **call}]}),)
        # TurnDone: the step is durable, so the completion may end.
        finish = self._chunk({}, _finish_reason(event.result))
        if self.include_usage:
            return finish, {**self.base, "choices": [], "usage": _usage(event.result)}
        return (finish,)


class _SampleChunks:
    """The chunks of a turn's samples (one unless ``n`` > 1), interleaved as the engine samples
    them: each sample's as :class:`_Chunks` renders them, at its index; the usage chunk (if
    asked) once, after every sample finished."""

    def __init__(
        self, turn: ChatTurn, started: TurnStarted, include_usage: bool, logprobs: _Logprobs | None
    ) -> None:
        self.samples = [_Chunks(turn, started, False, logprobs, i) for i in range(turn.n)]
        self.include_usage = include_usage
        self.done: list[TurnResult] = []

    def opening(self) -> tuple[dict[str, Any], ...]:
        return tuple(chunk for sample in self.samples for chunk in sample.opening())

    def render(self, event: SampleEvent) -> tuple[dict[str, Any], ...]:
        chunks = self.samples[event.index].render(event.event)
        if isinstance(event.event, TurnDone):
            self.done.append(event.event.result)
            if self.include_usage and len(self.done) == len(self.samples):
                usage = {**self.samples[0].base, "choices": [], "usage": _usage(*self.done)}
                return (*chunks, usage)
        return chunks


def _include_usage(raw: ChatCompletionRequest) -> bool:
    return bool(raw.stream_options and raw.stream_options.include_usage)


def _streamed(
    request: Request, turn: ChatTurn, raw: ChatCompletionRequest, started: TurnStarted
) -> _SampleChunks:
    return _SampleChunks(turn, started, _include_usage(raw), _logprobs(request, turn, raw))


_API = TurnApi(parse_request, _whole, _streamed, errors.OPENAI, sse.OPENAI_CHAT)


def router() -> APIRouter:
    routes = APIRouter()
    http.post_both_ways(routes, "/v1/chat/completions", _API.serve)
    return routes
