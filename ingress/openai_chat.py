"""OpenAI ``/v1/chat/completions`` ⇄ the internal turn model. Wire shapes end here."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from itertools import chain
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from ingress import http
from ingress.known_messages import KNOWN_MESSAGES
from ingress.output import ReasoningDelta, TextDelta, ToolCallDone
from ingress.service import TokensSampled, TurnDone, TurnEvent, TurnResult, TurnStarted
from ingress.turn import ChatTurn, SamplingOptions
from titoflow.errors import IngressError, InvalidRequest
from titoflow.tito.messages import Message, messages_from_fields


class _Lenient(BaseModel):
    # Clients send many fields we do not use (stream_options, reasoning_effort, ...): ignore them.
    model_config = ConfigDict(extra="ignore")


class _Function(_Lenient):
    name: str
    arguments: str | dict[str, Any] = "{}"


class _ToolCall(_Lenient):
    id: str
    type: Literal["function"] = "function"
    function: _Function


class _TextPart(_Lenient):
    type: str
    text: str = ""


class _Message(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[_TextPart] | None = None
    reasoning_content: str | None = None
    tool_calls: list[_ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class _NamedChoice(_Lenient):
    type: Literal["function"] = "function"
    function: dict[str, str]


class _StreamOptions(_Lenient):
    include_usage: bool = False


class ChatCompletionRequest(_Lenient):
    model: str
    # Each validated on its own as a _Message, once per replica (see ingress.known_messages).
    messages: list[Any] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["auto", "none", "required"] | _NamedChoice | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    stream: bool = False
    stream_options: _StreamOptions | None = None
    chat_template_kwargs: dict[str, Any] | None = None


def _text(content: str | list[_TextPart] | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    unsupported = sorted({part.type for part in content} - {"text", "input_text"})
    if unsupported:
        raise InvalidRequest(f"unsupported content part types: {unsupported}", "messages")
    return "".join(part.text for part in content)


def _message_fields(raw: _Message) -> dict[str, Any]:
    return {
        "role": "system" if raw.role == "developer" else raw.role,
        "content": _text(raw.content),
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


def _parse_new(new: list[tuple[int, Any]]) -> list[tuple[Message, ...]]:
    fields = [_message_fields(http.validated(_Message, raw, f"messages.{i}")) for i, raw in new]
    return [(message,) for message in messages_from_fields(fields)]


def parse_request(
    body: Any, path_session: str | None, headers: dict[str, str]
) -> tuple[ChatTurn, ChatCompletionRequest]:
    """Validate a chat.completions body into a turn (session: path, header, then body)."""
    request = http.validated(ChatCompletionRequest, body)
    choice = request.tool_choice
    named = choice.function.get("name") if isinstance(choice, _NamedChoice) else None
    session = http.session_ref(path_session, headers, body if isinstance(body, dict) else {})
    turn = ChatTurn(
        session=session,
        api="openai.chat",
        model=request.model,
        messages=tuple(
            chain.from_iterable(KNOWN_MESSAGES.parse("openai.chat", request.messages, _parse_new))
        ),
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
        template_kwargs=request.chat_template_kwargs or {},
    )
    return turn, request


_FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "stop"}


def _finish_reason(result: TurnResult) -> str:
    if result.parsed.tool_calls:
        return "tool_calls"
    return _FINISH_REASONS.get(result.generation.finish_reason, "stop")


def _usage(result: TurnResult) -> dict[str, int]:
    completion = len(result.generation.token_ids)
    return {
        "prompt_tokens": result.prompt_len,
        "completion_tokens": completion,
        "total_tokens": result.prompt_len + completion,
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


def completion_response(
    result: TurnResult, model: str, logprobs: _Logprobs | None
) -> dict[str, Any]:
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
        "id": f"chatcmpl-{result.step.step_id}",
        "object": "chat.completion",
        "created": int(result.step.event_time),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": _finish_reason(result),
                "logprobs": choice_logprobs,
            }
        ],
        "usage": _usage(result),
    }


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def _stream_chunks(
    turn: ChatTurn,
    started: TurnStarted,
    events: AsyncIterator[TurnEvent],
    include_usage: bool,
    logprobs: _Logprobs | None,
) -> AsyncIterator[str]:
    base: dict[str, Any] = {
        "id": f"chatcmpl-{started.step_id}",
        "object": "chat.completion.chunk",
        "created": int(started.created),
        "model": turn.model,
    }
    pending: list[dict[str, Any]] = []  # logprob entries not yet attached to a chunk

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
        if logprobs is not None:
            choice["logprobs"] = {"content": pending.copy()} if pending else None
            pending.clear()
        return _sse({**base, "choices": [choice]})

    yield chunk({"role": "assistant", "content": ""})
    try:
        async for event in events:
            if isinstance(event, TokensSampled):
                if logprobs is not None:
                    pending.extend(
                        logprobs.content(event.token_ids, event.logprobs, event.top_logprobs)
                    )
            elif isinstance(event, TextDelta):
                yield chunk({"content": event.text})
            elif isinstance(event, ReasoningDelta):
                yield chunk({"reasoning_content": event.text})
            elif isinstance(event, ToolCallDone):
                call = event.call.function_call(parsed_arguments=False)
                yield chunk({"tool_calls": [{"index": event.index, **call}]})
            elif isinstance(event, TurnDone):
                yield chunk({}, _finish_reason(event.result))
                if include_usage:
                    yield _sse({**base, "choices": [], "usage": _usage(event.result)})
    except IngressError as exc:  # the status line is gone: report in the stream, as OpenAI does
        yield _sse(error_body(exc))
        return
    yield "data: [DONE]\n\n"


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    503: "service_unavailable",
}


def error_body(error: IngressError) -> dict[str, Any]:
    return {
        "error": {
            "message": error.message,
            "type": _ERROR_TYPES.get(error.status, "server_error"),
            "param": error.param,
            "code": error.code,
            **error.details(),
        }
    }


def error_response(error: IngressError) -> JSONResponse:
    headers = {"retry-after": "1"} if error.retryable else None
    return JSONResponse(error_body(error), status_code=error.status, headers=headers)


async def _chat(request: Request, session: str | None) -> Response:
    try:
        body = await http.read_json(request)
        turn, raw = parse_request(body, session, http.lower_headers(request))
        http.check_session_key(request, turn.session.session_id, body)
        http.check_model(request, turn.model)
        logprobs = _Logprobs(request, turn.sampling.logprobs or 0) if raw.logprobs else None
        if raw.stream:
            include_usage = bool(raw.stream_options and raw.stream_options.include_usage)
            started, events = await http.service(request).open_stream(turn)
            return http.sse_response(_stream_chunks(turn, started, events, include_usage, logprobs))
        result = await http.service(request).complete(turn)
        return http.json_response(completion_response(result, turn.model, logprobs))
    except IngressError as exc:
        return error_response(exc)


def router() -> APIRouter:
    routes = APIRouter()
    http.post_both_ways(routes, "/v1/chat/completions", _chat)
    return routes
