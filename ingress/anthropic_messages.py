"""Anthropic ``/v1/messages`` ⇄ the internal turn model. Wire shapes end here.

Authentication is not checked: ``x-api-key`` and ``Authorization: Bearer`` are both accepted
with any value (Claude Code sends the first, the SDKs the second), and so is any
``anthropic-version`` and ``anthropic-beta``. The ingress is meant to sit inside a trusted
training network; scaffolds only need *some* key to start.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from itertools import chain
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from ingress import http
from ingress.known_messages import KNOWN_MESSAGES
from ingress.output import ReasoningDelta, TextDelta, ToolCallDone
from ingress.service import TurnDone, TurnEvent, TurnResult, TurnStarted
from ingress.turn import ChatTurn, SamplingOptions, SessionRef
from titoflow.errors import ContextOverflow, IngressError, InvalidRequest
from titoflow.tito.messages import Message, ToolCall

API = "anthropic.messages"


class _Lenient(BaseModel):
    # Clients send many fields we do not use (cache_control, citations, metadata, ...).
    model_config = ConfigDict(extra="ignore")


def _as_blocks(value: Any) -> Any:
    """A bare string is Anthropic's shorthand for one text block."""
    return [{"type": "text", "text": value}] if isinstance(value, str) else value


class _Text(_Lenient):
    type: Literal["text"]
    text: str


class _Unsupported(_Lenient):
    """Blocks a text-only policy cannot take; named so the client gets a clear 400."""

    type: Literal["image", "document"]


class _ToolUse(_Lenient):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class _ToolResult(_Lenient):
    type: Literal["tool_result"]
    tool_use_id: str
    content: Annotated[
        list[Annotated[_Text | _Unsupported, Field(discriminator="type")]],
        BeforeValidator(_as_blocks),
    ] = []
    is_error: bool = False  # accepted; the result's text is what the model reads


class _Thinking(_Lenient):
    type: Literal["thinking"]
    thinking: str


class _RedactedThinking(_Lenient):
    type: Literal["redacted_thinking"]


_Block = Annotated[
    _Text | _Unsupported | _ToolUse | _ToolResult | _Thinking | _RedactedThinking,
    Field(discriminator="type"),
]


class _Message(_Lenient):
    role: Literal["user", "assistant", "system"]  # system: Claude Code's mid-conversation one
    content: Annotated[list[_Block], BeforeValidator(_as_blocks)]


class _Tool(_Lenient):
    type: str | None = None
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None


class _ToolChoice(_Lenient):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None


class _ThinkingOption(_Lenient):
    type: Literal["enabled", "adaptive", "disabled"]


class CountTokensRequest(_Lenient):
    model: str
    # Each validated on its own as a _Message, once per replica (see ingress.known_messages).
    messages: list[Any] = Field(min_length=1)
    system: Annotated[list[_Text], BeforeValidator(_as_blocks)] = []
    tools: list[_Tool] = []
    tool_choice: _ToolChoice | None = None
    thinking: _ThinkingOption | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)  # required by Anthropic, so required here too
    temperature: float = Field(1.0, ge=0.0, le=1.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop_sequences: list[str] = []
    stream: bool = False


def _joined(blocks: list[_Text]) -> str:
    return "\n".join(block.text for block in blocks)


def _unsupported(block: _Unsupported, param: str) -> InvalidRequest:
    return InvalidRequest(
        f"{block.type} blocks are not supported: the policy takes text only", param
    )


def _tool_message(block: _ToolResult, param: str) -> Message:
    texts = []
    for index, part in enumerate(block.content):
        if isinstance(part, _Unsupported):
            raise _unsupported(part, f"{param}.content.{index}")
        texts.append(part)
    return Message(role="tool", content=_joined(texts), tool_call_id=block.tool_use_id)


def _user_messages(raw: _Message, param: str) -> list[Message]:
    """Each tool_result becomes a tool message and each run of text a user (or system)
    message, in the order the blocks came."""
    out: list[Message] = []
    texts: list[_Text] = []

    def flush() -> None:
        if texts:
            out.append(Message(role=raw.role, content=_joined(texts)))
            texts.clear()

    for index, block in enumerate(raw.content):
        where = f"{param}.content.{index}"
        if isinstance(block, _Text):
            texts.append(block)
        elif isinstance(block, _ToolResult) and raw.role == "user":
            flush()
            out.append(_tool_message(block, where))
        elif isinstance(block, _Unsupported):
            raise _unsupported(block, where)
        else:
            raise InvalidRequest(f"a {raw.role} message cannot hold {block.type} blocks", where)
    flush()
    return out or [Message(role=raw.role)]


def _assistant_message(raw: _Message, param: str) -> Message:
    texts: list[_Text] = []
    reasoning: list[str] = []
    calls: list[ToolCall] = []
    for index, block in enumerate(raw.content):
        if isinstance(block, _Text):
            texts.append(block)
        elif isinstance(block, _Thinking):
            reasoning.append(block.thinking)
        elif isinstance(block, _ToolUse):
            calls.append(ToolCall(id=block.id, name=block.name, arguments=json.dumps(block.input)))
        elif not isinstance(block, _RedactedThinking):  # opaque to us: nothing to render
            raise InvalidRequest(
                f"an assistant message cannot hold {block.type} blocks",
                f"{param}.content.{index}",
            )
    return Message(
        role="assistant",
        content=_joined(texts),
        reasoning="\n".join(reasoning) if reasoning else None,
        tool_calls=tuple(calls),
    )


def _parse_new(new: list[tuple[int, Any]]) -> list[tuple[Message, ...]]:
    out: list[tuple[Message, ...]] = []
    for index, wire in new:
        param = f"messages.{index}"
        raw = http.validated(_Message, wire, param)
        if raw.role == "assistant":
            out.append((_assistant_message(raw, param),))
        else:
            out.append(tuple(_user_messages(raw, param)))
    return out


def _messages(request: CountTokensRequest) -> tuple[Message, ...]:
    parsed = chain.from_iterable(KNOWN_MESSAGES.parse(API, request.messages, _parse_new))
    if request.system:
        return (Message(role="system", content=_joined(request.system)), *parsed)
    return tuple(parsed)


def _function_tools(tools: list[_Tool]) -> tuple[dict[str, Any], ...]:
    """Client tools in the OpenAI form chat templates take. Server tools (web search and the
    like, with a versioned ``type`` and no schema) run on Anthropic's side, which is not here,
    so they are left out of the prompt."""
    out = []
    for index, tool in enumerate(tools):
        if tool.type not in (None, "custom"):
            continue
        if tool.input_schema is None:
            raise InvalidRequest("tools need an input_schema", f"tools.{index}.input_schema")
        function = {"name": tool.name, "description": tool.description or ""}
        out.append({"type": "function", "function": {**function, "parameters": tool.input_schema}})
    return tuple(out)


_TOOL_CHOICES: dict[str, Literal["auto", "none", "required", "named"]] = {
    "auto": "auto",
    "any": "required",
    "tool": "named",
    "none": "none",
}


def _turn(request: CountTokensRequest, session: SessionRef) -> ChatTurn:
    choice = request.tool_choice or _ToolChoice(type="auto")
    if choice.type == "tool" and not choice.name:
        raise InvalidRequest('tool_choice of type "tool" needs a name', "tool_choice.name")
    thinking = request.thinking
    sampling = SamplingOptions()
    if isinstance(request, MessagesRequest):
        sampling = SamplingOptions(
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            stop=tuple(request.stop_sequences),
        )
    return ChatTurn(
        session=session,
        api=API,
        model=request.model,
        messages=_messages(request),
        tools=_function_tools(request.tools),
        tool_choice=_TOOL_CHOICES[choice.type],
        tool_choice_name=choice.name if choice.type == "tool" else None,
        sampling=sampling,
        # Absent: the template's own default, as a plain chat template call would do.
        template_kwargs={"enable_thinking": thinking.type != "disabled"} if thinking else {},
    )


def parse_request(
    body: Any, path_session: str | None, headers: dict[str, str]
) -> tuple[ChatTurn, MessagesRequest]:
    """Validate a messages body into a turn (session: path, header, then body)."""
    request = http.validated(MessagesRequest, body)
    session = http.session_ref(path_session, headers, body)
    return _turn(request, session), request


def parse_count_request(body: Any) -> ChatTurn:
    """A count_tokens body as a turn; counting records nothing, so it needs no session."""
    return _turn(http.validated(CountTokensRequest, body), SessionRef(session_id=""))


def _stop(result: TurnResult) -> tuple[str, str | None]:
    """stop_reason and stop_sequence (the engine names the stop string that matched)."""
    if result.parsed.tool_calls:
        return "tool_use", None
    if result.generation.finish_reason == "length":
        return "max_tokens", None
    if isinstance(result.generation.stop_reason, str):
        return "stop_sequence", result.generation.stop_reason
    return "end_turn", None


def _message(
    step_id: str,
    model: str,
    content: list[dict[str, Any]],
    stop: tuple[str | None, str | None],
    usage: dict[str, int],
) -> dict[str, Any]:
    return {
        "id": f"msg_{step_id}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop[0],
        "stop_sequence": stop[1],
        "usage": usage,
    }


def message_response(result: TurnResult, model: str) -> dict[str, Any]:
    parsed = result.parsed
    content: list[dict[str, Any]] = []
    if parsed.reasoning:
        content.append({"type": "thinking", "thinking": parsed.reasoning, "signature": ""})
    if parsed.content:
        content.append({"type": "text", "text": parsed.content})
    content += [
        {"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments_value()}
        for call in parsed.tool_calls
    ]
    usage = {"input_tokens": result.prompt_len, "output_tokens": len(result.generation.token_ids)}
    return _message(result.step.step_id, model, content, _stop(result), usage)


def _sse(payload: dict[str, Any]) -> str:
    return f"event: {payload['type']}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"


class _Blocks:
    """Content block bookkeeping of one streamed message: a block opens when the kind of
    output changes and closes before the next one opens."""

    def __init__(self) -> None:
        self.index = -1
        self.open_kind: str | None = None

    def start(self, block: dict[str, Any]) -> list[str]:
        events = self.stop()
        self.index += 1
        self.open_kind = block["type"]
        start = {"type": "content_block_start", "index": self.index, "content_block": block}
        return [*events, _sse(start)]

    def delta(self, delta: dict[str, Any]) -> str:
        return _sse({"type": "content_block_delta", "index": self.index, "delta": delta})

    def stop(self) -> list[str]:
        if self.open_kind is None:
            return []
        self.open_kind = None
        return [_sse({"type": "content_block_stop", "index": self.index})]


async def _stream_events(
    turn: ChatTurn, started: TurnStarted, events: AsyncIterator[TurnEvent]
) -> AsyncIterator[str]:
    usage = {"input_tokens": started.prompt_len, "output_tokens": 0}
    opening = _message(started.step_id, turn.model, [], (None, None), usage)
    yield _sse({"type": "message_start", "message": opening})
    blocks = _Blocks()
    try:
        async for event in events:
            if isinstance(event, ReasoningDelta):
                if blocks.open_kind != "thinking":
                    for line in blocks.start({"type": "thinking", "thinking": "", "signature": ""}):
                        yield line
                yield blocks.delta({"type": "thinking_delta", "thinking": event.text})
            elif isinstance(event, TextDelta):
                if blocks.open_kind != "text":
                    for line in blocks.start({"type": "text", "text": ""}):
                        yield line
                yield blocks.delta({"type": "text_delta", "text": event.text})
            elif isinstance(event, ToolCallDone):
                call = event.call
                block = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
                for line in blocks.start(block):
                    yield line
                yield blocks.delta({"type": "input_json_delta", "partial_json": call.arguments})
                for line in blocks.stop():
                    yield line
            elif isinstance(event, TurnDone):  # the step is durable: now the message may end
                for line in blocks.stop():
                    yield line
                result = event.result
                yield _sse(
                    {
                        "type": "message_delta",
                        "delta": dict(
                            zip(("stop_reason", "stop_sequence"), _stop(result), strict=True)
                        ),
                        "usage": {"output_tokens": len(result.generation.token_ids)},
                    }
                )
                yield _sse({"type": "message_stop"})
    except IngressError as exc:  # the status line is gone: report in the stream, as Anthropic does
        yield _sse(error_body(exc))


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
}


def _status_and_type(error: IngressError) -> tuple[int, str]:
    if error.retryable:  # 529 is what Claude Code and the SDKs retry with backoff
        return 529, "overloaded_error"
    if error.status in _ERROR_TYPES:
        return error.status, _ERROR_TYPES[error.status]
    return 500, "api_error"


def error_body(error: IngressError) -> dict[str, Any]:
    _, kind = _status_and_type(error)
    message = error.message
    if isinstance(error, ContextOverflow):  # Claude Code recognises this wording (offers /compact)
        message = f"prompt is too long: {error.prompt_tokens} tokens > {error.limit} maximum"
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_response(error: IngressError) -> JSONResponse:
    status, _ = _status_and_type(error)
    headers = {"retry-after": "1"} if error.retryable else None
    return JSONResponse(error_body(error), status_code=status, headers=headers)


async def _messages_call(request: Request, session: str | None) -> Response:
    try:
        body = await http.read_json(request)
        turn, raw = parse_request(body, session, http.lower_headers(request))
        http.check_session_key(request, turn.session.session_id, body)
        http.check_model(request, turn.model)
        if raw.stream:
            started, events = await http.service(request).open_stream(turn)
            return http.sse_response(_stream_events(turn, started, events))
        result = await http.service(request).complete(turn)
        return http.json_response(message_response(result, turn.model))
    except IngressError as exc:
        return error_response(exc)


async def _count_tokens(request: Request) -> Response:
    try:
        turn = parse_count_request(await http.read_json(request))
        http.check_model(request, turn.model)
        return JSONResponse({"input_tokens": http.service(request).count_prompt_tokens(turn)})
    except IngressError as exc:
        return error_response(exc)


def router() -> APIRouter:
    routes = APIRouter()

    # Any query string (Claude Code adds ?beta=true) is accepted: FastAPI ignores unknown ones.
    http.post_both_ways(routes, "/v1/messages", _messages_call)

    @routes.post("/sess/{session}/v1/messages/count_tokens")
    @routes.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Response:
        return await _count_tokens(request)

    return routes
