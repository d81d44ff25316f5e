"""OpenAI ``/v1/chat/completions`` ⇄ the internal turn model. Wire shapes end here."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ingress.service import TurnResult
from ingress.turn import ChatTurn, Message, SamplingOptions, SessionRef, ToolCall
from titoflow.errors import IngressError, InvalidRequest


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


class ChatCompletionRequest(_Lenient):
    model: str
    messages: list[_Message] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = None
    n: int = Field(1, ge=1, le=1)
    stream: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    session_id: str | None = None
    instance_id: str | None = None
    turn_id: str | None = None
    metadata: dict[str, Any] | None = None


def _text(content: str | list[_TextPart] | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    unsupported = sorted({part.type for part in content} - {"text", "input_text"})
    if unsupported:
        raise InvalidRequest(f"unsupported content part types: {unsupported}", "messages")
    return "".join(part.text for part in content)


def _message(raw: _Message) -> Message:
    calls = tuple(
        ToolCall(
            id=call.id,
            name=call.function.name,
            arguments=call.function.arguments
            if isinstance(call.function.arguments, str)
            else json.dumps(call.function.arguments),
        )
        for call in raw.tool_calls or ()
    )
    return Message(
        role="system" if raw.role == "developer" else raw.role,
        content=_text(raw.content),
        reasoning=raw.reasoning_content,
        tool_calls=calls,
        tool_call_id=raw.tool_call_id,
        name=raw.name,
    )


def _body_field(request: ChatCompletionRequest, name: str) -> str | None:
    value = getattr(request, name) or (request.metadata or {}).get(name)
    return str(value) if value is not None else None


def parse_request(body: Any, path_session: str | None, headers: dict[str, str]) -> ChatTurn:
    """Validate a chat.completions body. Session id: path, then ``X-Session-Id``, then body."""
    try:
        request = ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        message = f"{param}: {first['msg']}" if param else f"the body: {first['msg']}"
        raise InvalidRequest(message, param) from exc
    if request.stream:
        raise InvalidRequest("stream=true is not supported yet; send stream=false", "stream")
    session_id = path_session or headers.get("x-session-id") or _body_field(request, "session_id")
    if not session_id:
        raise InvalidRequest(
            "no session: use the /sess/<id>/v1 base URL, an X-Session-Id header, "
            "or a session_id field",
            "session_id",
        )
    return ChatTurn(
        session=SessionRef(
            session_id=session_id,
            instance_id=headers.get("x-instance-id") or _body_field(request, "instance_id"),
            turn_id=headers.get("x-turn-id") or _body_field(request, "turn_id"),
        ),
        api="openai.chat",
        model=request.model,
        messages=tuple(_message(m) for m in request.messages),
        tools=tuple(request.tools or ()),
        sampling=SamplingOptions(
            max_tokens=request.max_completion_tokens or request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed,
        ),
        template_kwargs=request.chat_template_kwargs or {},
    )


_FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "stop"}


def completion_response(result: TurnResult, model: str) -> dict[str, Any]:
    parsed = result.parsed
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content or None}
    if parsed.reasoning is not None:
        message["reasoning_content"] = parsed.reasoning
    if parsed.tool_calls:
        message["tool_calls"] = [
            call.function_call(parsed_arguments=False) for call in parsed.tool_calls
        ]
    finish = (
        "tool_calls"
        if parsed.tool_calls
        else _FINISH_REASONS.get(result.generation.finish_reason, "stop")
    )
    completion_tokens = len(result.generation.token_ids)
    return {
        "id": f"chatcmpl-{result.step.step_id}",
        "object": "chat.completion",
        "created": int(result.step.event_time),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {
            "prompt_tokens": result.prompt_len,
            "completion_tokens": completion_tokens,
            "total_tokens": result.prompt_len + completion_tokens,
        },
    }


_ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error", 503: "service_unavailable"}


def error_body(error: IngressError) -> dict[str, Any]:
    return {
        "error": {
            "message": error.message,
            "type": _ERROR_TYPES.get(error.status, "server_error"),
            "param": error.param,
            "code": error.code,
        }
    }
