"""Anthropic ``/v1/messages`` ⇄ the internal turn model. Wire shapes end here.

Authentication is not checked: ``x-api-key`` and ``Authorization: Bearer`` are both accepted
with any value (Claude Code sends the first, the SDKs the second), and so is any
``anthropic-version`` and ``anthropic-beta``. The ingress is meant to sit inside a trusted
training network; scaffolds only need *some* key to start.

Invariant: a stream keeps one content block open at a time, in the order the model wrote
them: a block opens when the kind of output changes and closes before the next opens (a tool
call opens and closes its own), indexes counting up from 0; ``message_stop`` follows only a
durable step.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BeforeValidator, Field

from ingress.turns.service import TurnDone, TurnEvent, TurnResult, TurnStarted
from ingress.turns.turn import ChatTurn, SamplingOptions, SessionRef
from ingress.wire import errors, http, sse
from ingress.wire.adapter import ToolName, image_at, one_sample, token_counts
from ingress.wire.known_messages import KNOWN_MESSAGES, KnownTurn
from titoflow.errors import InvalidRequest, TitoflowError
from titoflow.tito.messages import Message, MessageImage, ToolCall
from titoflow.tito.output import ReasoningDelta, TextDelta, ToolCallDone

API = "anthropic.messages"


def _as_blocks(value: Any) -> Any:
    """A bare string is Anthropic's shorthand for one text block."""
    return [{"type": "text", "text": value}] if isinstance(value, str) else value


class _Text(http.Lenient):
    type: Literal["text"]
    text: str


class _Unsupported(http.Lenient):
    """Blocks the policy cannot take; named so the client gets a clear 400."""

    type: Literal["document"]


class _Image(http.Lenient):
    """An image: ``source`` is ``{"type": "base64", "media_type", "data"}`` or ``{"type":
    "url", "url"}`` (fetched by the ingress: ingress/turns/image_urls.py)."""

    type: Literal["image"]
    source: dict[str, Any]

    def data_url(self) -> Any:
        if self.source.get("type") == "base64":
            return f"data:{self.source.get('media_type')};base64,{self.source.get('data')}"
        return self.source.get("url")


class _ToolUse(http.Lenient):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class _ToolResult(http.Lenient):
    type: Literal["tool_result"]
    tool_use_id: str
    content: Annotated[
        list[Annotated[_Text | _Image | _Unsupported, Field(discriminator="type")]],
        BeforeValidator(_as_blocks),
    ] = Field(default_factory=list)
    is_error: bool = False  # accepted; the result's text is what the model reads


class _Thinking(http.Lenient):
    type: Literal["thinking"]
    thinking: str


class _RedactedThinking(http.Lenient):
    type: Literal["redacted_thinking"]


_Block = Annotated[
    _Text | _Image | _Unsupported | _ToolUse | _ToolResult | _Thinking | _RedactedThinking,
    Field(discriminator="type"),
]


class _Message(http.Lenient):
    role: Literal["user", "assistant", "system"]  # system: Claude Code's mid-conversation one
    content: Annotated[list[_Block], BeforeValidator(_as_blocks)]


class _Tool(http.Lenient):
    type: str | None = None
    name: ToolName
    description: str | None = None
    input_schema: dict[str, Any] | None = None


class _ToolChoice(http.Lenient):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None


class _ThinkingOption(http.Lenient):
    type: Literal["enabled", "adaptive", "disabled"]


class CountTokensRequest(http.Lenient):
    model: str
    # Each validated on its own as a _Message, once per replica (see ingress.wire.known_messages).
    messages: list[Any] = Field(min_length=1)
    system: Annotated[list[_Text], BeforeValidator(_as_blocks)] = Field(default_factory=list)
    tools: list[_Tool] = Field(default_factory=list)
    tool_choice: _ToolChoice | None = None
    thinking: _ThinkingOption | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)  # required by Anthropic, so required here too
    temperature: float = Field(1.0, ge=0.0, le=1.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=1)
    stop_sequences: list[str] = Field(default_factory=list)
    stream: bool = False


def _joined(blocks: list[_Text]) -> str:
    return "\n".join(block.text for block in blocks)


def _unsupported(block: _Unsupported, param: str) -> InvalidRequest:
    return InvalidRequest(
        f"{block.type} blocks are not supported: the policy takes text only", param
    )


def _with_images(parts: list[tuple[_Text | _Image, str]]) -> tuple[str, tuple[MessageImage, ...]]:
    """Text blocks joined as :func:`_joined` joins them, each image at the point of the text
    it follows (``parts``: each block with its param)."""
    text, texts = "", 0
    images: list[MessageImage] = []
    for part, param in parts:
        if isinstance(part, _Image):
            images.append(image_at(part.data_url(), len(text), f"{param}.source"))
            continue
        text += ("\n" if texts else "") + part.text
        texts += 1
    return text, tuple(images)


def _tool_message(block: _ToolResult, param: str) -> Message:
    parts: list[tuple[_Text | _Image, str]] = []
    for index, part in enumerate(block.content):
        if isinstance(part, _Unsupported):
            raise _unsupported(part, f"{param}.content.{index}")
        parts.append((part, f"{param}.content.{index}"))
    if any(isinstance(part, _Image) for part, _ in parts):
        text, images = _with_images(parts)
        return Message(role="tool", content=text, tool_call_id=block.tool_use_id, images=images)
    texts = [part for part, _ in parts if isinstance(part, _Text)]
    return Message(role="tool", content=_joined(texts), tool_call_id=block.tool_use_id)


def _user_messages(raw: _Message, param: str) -> list[Message]:
    """Each tool_result becomes a tool message and each run of text a user (or system)
    message, in the order the blocks came."""
    out: list[Message] = []
    run: list[tuple[_Text | _Image, str]] = []  # the blocks of the message being gathered

    def flush() -> None:
        if any(isinstance(block, _Image) for block, _ in run):
            text, images = _with_images(run)
            out.append(Message(role=raw.role, content=text, images=images))
        elif run:
            texts = [block for block, _ in run if isinstance(block, _Text)]
            out.append(Message(role=raw.role, content=_joined(texts)))
        run.clear()

    for index, block in enumerate(raw.content):
        where = f"{param}.content.{index}"
        if isinstance(block, _Text) or (isinstance(block, _Image) and raw.role == "user"):
            run.append((block, where))
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


def _messages(request: CountTokensRequest) -> KnownTurn:
    """The messages (the system prompt, text, first) and whether they are text only."""
    known = KNOWN_MESSAGES.parse_turn(API, request.messages, _parse_new)
    if request.system:
        system = Message(role="system", content=_joined(request.system))
        return known._replace(messages=(system, *known.messages))
    return known


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
            top_k=request.top_k or -1,
            stop=tuple(request.stop_sequences),
        )
    known = _messages(request)
    return ChatTurn(
        session=session,
        api=API,
        model=request.model,
        messages=known.messages,
        text_only=known.text_only,
        tools=_function_tools(request.tools),
        tool_choice=_TOOL_CHOICES[choice.type],
        tool_choice_name=choice.name if choice.type == "tool" else None,
        sampling=sampling,
        # Absent: the template's own default, as a plain chat template call would do.
        template_kwargs={"enable_thinking": thinking.type != "disabled"} if thinking else {},
    )


def parse_request(body: Any, session: SessionRef) -> tuple[ChatTurn, MessagesRequest]:
    """Validate a messages body into a turn of ``session``."""
    request = http.validated(MessagesRequest, body)
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
    prompt, generated = token_counts(result)
    usage = {"input_tokens": prompt, "output_tokens": generated}
    return _message(result.step.step_id, model, content, _stop(result), usage)


def _whole(
    request: Request, turn: ChatTurn, raw: MessagesRequest, result: TurnResult
) -> dict[str, Any]:
    return message_response(result, turn.model)


class _Events:
    """One streamed message's events; ``index`` and ``open_kind`` are the open content block."""

    def __init__(self, turn: ChatTurn, started: TurnStarted) -> None:
        self.turn = turn
        self.started = started
        self.index = -1
        self.open_kind: str | None = None

    def opening(self) -> tuple[dict[str, Any], ...]:
        usage = {"input_tokens": self.started.prompt_len, "output_tokens": 0}
        opening = _message(self.started.step_id, self.turn.model, [], (None, None), usage)
        return ({"type": "message_start", "message": opening},)

    def _start(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._stop()
        self.index += 1
        self.open_kind = block["type"]
        return [
            *events,
            {"type": "content_block_start", "index": self.index, "content_block": block},
        ]

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self.index, "delta": delta}

    def _stop(self) -> list[dict[str, Any]]:
        if self.open_kind is None:
            return []
        self.open_kind = None
        return [{"type": "content_block_stop", "index": self.index}]

    def _continue(self, kind: str, delta: dict[str, Any]) -> list[dict[str, Any]]:
        """``delta`` in the open block, opening a block of ``kind`` first if it is not open."""
        if self.open_kind == kind:
            return [self._delta(delta)]
        block = (
            {"type": "thinking", "thinking": "", "signature": ""}
            if kind == "thinking"
            else {"type": "text", "text": ""}
        )
        return [*self._start(block), self._delta(delta)]

    def render(self, event: TurnEvent) -> list[dict[str, Any]]:
        if isinstance(event, ReasoningDelta):
            return self._continue("thinking", {"type": "thinking_delta", "thinking": event.text})
        if isinstance(event, TextDelta):
            return self._continue("text", {"type": "text_delta", "text": event.text})
        if isinstance(event, ToolCallDone):
            call = event.call
            block = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": call.arguments}
            return [*self._start(block), self._delta(delta), *self._stop()]
        if isinstance(event, TurnDone):  # the step is durable: now the message may end
            stop = dict(zip(("stop_reason", "stop_sequence"), _stop(event.result), strict=True))
            usage = {"output_tokens": token_counts(event.result)[1]}
            return [
                *self._stop(),
                {"type": "message_delta", "delta": stop, "usage": usage},
                {"type": "message_stop"},
            ]
        return []


def _streamed(
    request: Request, turn: ChatTurn, raw: MessagesRequest, started: TurnStarted
) -> _Events:
    return _Events(turn, started)


_API = one_sample(parse_request, _whole, _streamed, errors.ANTHROPIC, sse.ANTHROPIC)


async def count_tokens(request: Request) -> Response:
    try:
        body = await http.read_json(request)
        http.check_counting_key(request, body)
        turn = parse_count_request(body)
        http.check_model(request, turn.model)
        return JSONResponse({"input_tokens": await http.service(request).count_prompt_tokens(turn)})
    except TitoflowError as exc:
        return errors.ANTHROPIC.response(exc)


def router() -> APIRouter:
    routes = APIRouter()
    # Any query string (Claude Code adds ?beta=true) is accepted: FastAPI ignores unknown ones.
    http.post_both_ways(routes, "/v1/messages", _API.serve)
    for path in ("/v1/messages/count_tokens", "/sess/{session}/v1/messages/count_tokens"):
        routes.add_api_route(path, count_tokens, methods=["POST"])
    return routes
