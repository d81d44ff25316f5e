"""OpenAI ``/v1/responses`` ⇄ the internal turn model. Wire shapes end here.

Stateless, like the rest of the ingress: nothing is stored server-side. ``store: true`` is
accepted (the SDKs and openai-agents may send it) but no response is kept, so there is nothing to
retrieve later; ``previous_response_id`` and ``conversation`` are refused with a 400 that asks for
the full conversation in ``input`` (what Codex sends anyway, with ``store: false``).

One response's output items (reasoning, message, function calls) are one assistant turn of the
policy; when a client echoes them back as input items they are folded into that one assistant
message again, so the echo matches the recorded step and the next call extends its chain (TITO).

Invariant: a whole response and a streamed one of the same turn hold the same output items
with the same ids, because both are built by feeding the turn's deltas, in order, to one
:class:`_OutputItems`; ``response.completed`` (or ``response.incomplete``) follows only a
durable step.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import Field

from ingress.turns.service import TurnDone, TurnEvent, TurnResult, TurnStarted
from ingress.turns.turn import ChatTurn, SamplingOptions, SessionRef
from ingress.wire import errors, http, sse
from ingress.wire.adapter import (
    TextPart,
    ToolName,
    content_with_images,
    has_image,
    one_sample,
    text_of,
    token_counts,
)
from titoflow.errors import InvalidRequest
from titoflow.tito.messages import Message, MessageImage, ToolCall
from titoflow.tito.output import OutputDelta, ParsedOutput, ReasoningDelta, TextDelta, ToolCallDone

API = "openai.responses"


class _NamedChoice(http.Lenient):
    type: Literal["function"]
    name: str


class ResponsesRequest(http.Lenient):
    model: str
    input: str | list[Any]
    instructions: str | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: Literal["auto", "none", "required"] | _NamedChoice = "auto"
    parallel_tool_calls: bool = True  # echoed; the parser takes every call the model writes
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stream: bool = False
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None


class _InputMessage(http.Lenient):
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[TextPart]


class _FunctionCall(http.Lenient):
    call_id: str
    name: str
    arguments: str


class _FunctionCallOutput(http.Lenient):
    call_id: str
    output: str | list[TextPart]


class _Reasoning(http.Lenient):
    summary: list[TextPart] = Field(default_factory=list)
    # Raw reasoning, when a client sends it; encrypted_content is opaque and dropped.
    content: list[TextPart] | None = None


class _FunctionTool(http.Lenient):
    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None


_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
# An image part: its image_url a data: or http(s) URL (a file_id names a stored file: refused).
_IMAGE = "input_image"


def _text_and_images(
    content: str | list[TextPart], param: str
) -> tuple[str, tuple[MessageImage, ...]]:
    """A content's text and images; text alone (any other part a 400) where it has none."""
    if isinstance(content, list) and has_image(content, _IMAGE):
        return content_with_images(content, _TEXT_PARTS, param, _IMAGE)
    return text_of(content, _TEXT_PARTS, param, param_in_message=True), ()


# Records of hosted tools the client ran itself; their findings reach the model as message text.
_IGNORED_ITEMS = frozenset({"web_search_call"})


class _Transcript:
    """Input items → chat messages. A function call continues the assistant turn right before
    it (message or calls); an assistant message right after a function call is text the model
    wrote after its calls in the same response, so it continues that turn too. Reasoning items
    go to the next assistant item, and are dropped if none follows."""

    def __init__(self, instructions: str | None) -> None:
        self.messages: list[Message] = []
        if instructions:
            self.messages.append(Message(role="system", content=instructions))
        self._reasoning: list[str] = []  # not yet attached to an assistant turn
        self._last = ""  # the last item kept: "message", "function_call", or another role

    def _other(self, message: Message) -> None:
        self.messages.append(message)
        self._reasoning = []
        self._last = message.role

    def _assistant(self, kind: str, content: str = "", call: ToolCall | None = None) -> None:
        pending = "".join(self._reasoning) or None
        self._reasoning = []
        calls = (call,) if call else ()
        joins = self._last == "function_call" or (
            kind == "function_call" and self._last == "message"
        )
        if joins:
            last = self.messages[-1]
            reasoning = (last.reasoning or "") + pending if pending else last.reasoning
            update = {
                "content": last.content + content,
                "tool_calls": (*last.tool_calls, *calls),
                "reasoning": reasoning,
            }
            self.messages[-1] = last.model_copy(update=update)
        else:
            self.messages.append(
                Message(role="assistant", content=content, reasoning=pending, tool_calls=calls)
            )
        self._last = kind

    def add(self, raw: Any, at: str) -> None:
        if not isinstance(raw, dict):
            raise InvalidRequest(f"{at}: an input item must be an object", at)
        kind = raw.get("type", "message")
        if not isinstance(kind, str):
            raise InvalidRequest(f"{at}.type: an item's type must be a string", f"{at}.type")
        if kind in _IGNORED_ITEMS:
            return
        if kind == "message":
            message = http.validated(_InputMessage, raw, at)
            text, images = _text_and_images(message.content, f"{at}.content")
            if images and message.role != "user":
                raise InvalidRequest(f"{at}: only user messages may hold images", at)
            if message.role == "assistant":
                self._assistant("message", content=text)
            else:
                role: Literal["user", "system"] = "user" if message.role == "user" else "system"
                self._other(Message(role=role, content=text, images=images))
        elif kind == "function_call":
            fc = http.validated(_FunctionCall, raw, at)
            self._assistant(
                kind, call=ToolCall(id=fc.call_id, name=fc.name, arguments=fc.arguments)
            )
        elif kind == "function_call_output":
            output = http.validated(_FunctionCallOutput, raw, at)
            text, images = _text_and_images(output.output, f"{at}.output")
            self._other(
                Message(role="tool", content=text, tool_call_id=output.call_id, images=images)
            )
        elif kind == "reasoning":
            item = http.validated(_Reasoning, raw, at)
            self._reasoning.append("".join(part.text for part in item.content or item.summary))
        elif kind == "item_reference":
            raise InvalidRequest(
                f"{at}: item references need stored items, and nothing is stored here; "
                "send the items themselves",
                at,
            )
        else:
            raise InvalidRequest(f"{at}: unsupported input item type {kind!r}", f"{at}.type")


def _chat_tools(tools: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    """Function tools in the chat form templates take. Hosted and namespace tools (Codex sends
    ``web_search`` and a ``namespace`` tool) are left out: this policy cannot call them here."""
    chat = []
    for index, tool in enumerate(tools):
        kind = tool.get("type")
        if not isinstance(kind, str):
            raise InvalidRequest(
                f"tools.{index}.type: a tool's type must be a string", f"tools.{index}.type"
            )
        if kind == "function":
            function = http.validated(_FunctionTool, tool, f"tools.{index}")
            # "strict" is an API switch, not part of the tool the model reads.
            chat.append({"type": "function", "function": function.model_dump(exclude_none=True)})
    return tuple(chat)


def parse_request(body: Any, session: SessionRef) -> tuple[ChatTurn, ResponsesRequest]:
    """Validate a responses body into a turn of ``session``."""
    request = http.validated(ResponsesRequest, body)
    for stateful in ("previous_response_id", "conversation"):
        if getattr(request, stateful) is not None:
            raise InvalidRequest(
                f"{stateful} is not supported: this ingress stores no responses; "
                "send the full conversation in input",
                stateful,
            )
    transcript = _Transcript(request.instructions)
    if isinstance(request.input, str):
        transcript.add({"role": "user", "content": request.input}, "input")
    else:
        for index, item in enumerate(request.input):
            transcript.add(item, f"input.{index}")
    if not transcript.messages:
        raise InvalidRequest("input: no messages to answer", "input")
    choice = request.tool_choice
    turn = ChatTurn(
        session=session,
        api=API,
        model=request.model,
        messages=tuple(transcript.messages),
        tools=_chat_tools(request.tools),
        tool_choice="named" if isinstance(choice, _NamedChoice) else choice,
        tool_choice_name=choice.name if isinstance(choice, _NamedChoice) else None,
        sampling=SamplingOptions(
            max_tokens=request.max_output_tokens,
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
        ),
    )
    return turn, request


def _echo(request: ResponsesRequest) -> dict[str, Any]:
    """The request settings a response object repeats back."""
    choice = request.tool_choice
    return {
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "model": request.model,
        "parallel_tool_calls": request.parallel_tool_calls,
        "previous_response_id": None,
        "store": False,  # whatever was asked: nothing is stored
        "temperature": request.temperature,
        "tool_choice": choice.model_dump() if isinstance(choice, _NamedChoice) else choice,
        "tools": [t for t in request.tools if t.get("type") == "function"],
        "top_p": request.top_p,
    }


def _response(
    step_id: str,
    created: float,
    echo: dict[str, Any],
    output: list[dict[str, Any]],
    result: TurnResult | None,
) -> dict[str, Any]:
    """The response object; ``result`` None: still in progress (the opening events)."""
    status, incomplete, usage = "in_progress", None, None
    if result is not None:
        status = "completed"
        if result.generation.finish_reason == "length":
            status, incomplete = "incomplete", {"reason": "max_output_tokens"}
        prompt, generated = token_counts(result)
        usage = {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": generated,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + generated,
        }
    return {
        "id": f"resp_{step_id}",
        "object": "response",
        "created_at": int(created),
        "status": status,
        "error": None,
        "incomplete_details": incomplete,
        **echo,
        "output": output,
        "usage": usage,
        "metadata": {},
    }


# The item kinds that stream text: id prefix, part event prefix, text event prefix.
_STREAMED = {
    "reasoning": ("rs", "response.reasoning_summary_part", "response.reasoning_summary_text"),
    "message": ("msg", "response.content_part", "response.output_text"),
}


def _part(kind: str, text: str) -> dict[str, Any]:
    if kind == "reasoning":
        return {"type": "summary_text", "text": text}
    return {"type": "output_text", "text": text, "annotations": []}


class _OutputItems:
    """Output items built from a turn's deltas in the order they arrive, with the events that
    stream them. One item is open at a time, so every client sees the same items in the same
    order; text after a tool call opens a new message item. Ids derive from the step id."""

    def __init__(self, step_id: str) -> None:
        self.step_id = step_id
        self.items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # a reasoning or message item taking deltas
        self._text = ""

    def _add(self, kind: str, prefix: str, **fields: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """A new item and its ``output_item.added`` event (a snapshot: the item changes later)."""
        index = len(self.items)
        item = {"type": kind, "id": f"{prefix}_{self.step_id}_{index}", **fields}
        self.items.append(item)
        return item, {
            "type": "response.output_item.added",
            "output_index": index,
            "item": dict(item),
        }

    def _at(self, item: dict[str, Any]) -> dict[str, Any]:
        """Where a part event points; reasoning text is summary 0, message text content 0."""
        index = "summary_index" if item["type"] == "reasoning" else "content_index"
        return {"item_id": item["id"], "output_index": self.items.index(item), index: 0}

    def _done(self, item: dict[str, Any]) -> dict[str, Any]:
        index = self.items.index(item)
        return {"type": "response.output_item.done", "output_index": index, "item": item}

    def _open_item(self, kind: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        prefix, part_event, _ = _STREAMED[kind]
        if kind == "reasoning":
            item, added = self._add(kind, prefix, summary=[])
        else:
            item, added = self._add(
                kind, prefix, status="in_progress", role="assistant", content=[]
            )
        self._open, self._text = item, ""
        part = {"type": f"{part_event}.added", **self._at(item), "part": _part(kind, "")}
        return item, [added, part]

    def _close(self) -> list[dict[str, Any]]:
        item, text = self._open, self._text
        if item is None:
            return []
        self._open = None
        kind = item["type"]
        _, part_event, text_event = _STREAMED[kind]
        part = _part(kind, text)
        if kind == "reasoning":
            item["summary"] = [part]
        else:
            item.update(content=[part], status="completed")
        done = {"type": f"{text_event}.done", **self._at(item), "text": text, **_logprobs(kind)}
        part_done = {"type": f"{part_event}.done", **self._at(item), "part": part}
        return [done, part_done, self._done(item)]

    def _function_call(self, call: ToolCall) -> list[dict[str, Any]]:
        item, added = self._add(
            "function_call",
            "fc",
            call_id=call.id,
            name=call.name,
            arguments="",
            status="in_progress",
        )
        item.update(arguments=call.arguments, status="completed")
        at = {"item_id": item["id"], "output_index": self.items.index(item)}
        arguments = {"name": call.name, "arguments": call.arguments}
        return [
            added,
            {"type": "response.function_call_arguments.delta", **at, "delta": call.arguments},
            {"type": "response.function_call_arguments.done", **at, **arguments},
            self._done(item),
        ]

    def feed(self, delta: OutputDelta) -> list[dict[str, Any]]:
        if isinstance(delta, ToolCallDone):
            return [*self._close(), *self._function_call(delta.call)]
        kind = "reasoning" if isinstance(delta, ReasoningDelta) else "message"
        item, events = self._open, []
        if item is None or item["type"] != kind:
            events = self._close()
            item, opened = self._open_item(kind)
            events += opened
        self._text += delta.text
        text_event = _STREAMED[kind][2]
        moved = {"type": f"{text_event}.delta", **self._at(item), "delta": delta.text}
        return [*events, {**moved, **_logprobs(kind)}]

    def finish(self) -> list[dict[str, Any]]:
        # An empty output would leave SDK agents without a final answer: send an empty message.
        opened = [] if self.items else self._open_item("message")[1]
        return [*opened, *self._close()]


def _logprobs(kind: str) -> dict[str, Any]:
    # The SDK's output_text events require the field; logprobs are not offered here.
    return {"logprobs": []} if kind == "message" else {}


def _deltas(parsed: ParsedOutput) -> list[OutputDelta]:
    """A whole turn as the deltas a stream of it would carry, in the order the parser emits."""
    deltas: list[OutputDelta] = []
    if parsed.reasoning:
        deltas.append(ReasoningDelta(parsed.reasoning))
    if parsed.content:
        deltas.append(TextDelta(parsed.content))
    return deltas + [ToolCallDone(i, call) for i, call in enumerate(parsed.tool_calls)]


def response_object(result: TurnResult, echo: dict[str, Any]) -> dict[str, Any]:
    items = _OutputItems(result.step.step_id)
    for delta in _deltas(result.parsed):
        items.feed(delta)
    items.finish()
    return _response(result.step.step_id, result.step.event_time, echo, items.items, result)


def _whole(
    request: Request, turn: ChatTurn, raw: ResponsesRequest, result: TurnResult
) -> dict[str, Any]:
    return response_object(result, _echo(raw))


class _Events:
    """One streamed response's events: opened in progress, its items as they stream, then
    the final response object."""

    def __init__(self, echo: dict[str, Any], started: TurnStarted) -> None:
        self.echo = echo
        self.started = started
        self.items = _OutputItems(started.step_id)

    def opening(self) -> tuple[dict[str, Any], ...]:
        opening = _response(self.started.step_id, self.started.created, self.echo, [], None)
        return (
            {"type": "response.created", "response": opening},
            {"type": "response.in_progress", "response": opening},
        )

    def render(self, event: TurnEvent) -> list[dict[str, Any]]:
        if isinstance(event, TurnDone):  # the step is durable: now the response may end
            events = self.items.finish()
            started = self.started
            final = _response(
                started.step_id, started.created, self.echo, self.items.items, event.result
            )
            # As OpenAI does, a truncated response ends with response.incomplete.
            ending = (
                "response.completed" if final["status"] == "completed" else "response.incomplete"
            )
            return [*events, {"type": ending, "response": final}]
        if isinstance(event, TextDelta | ReasoningDelta | ToolCallDone):
            return self.items.feed(event)
        return []


def _streamed(
    request: Request, turn: ChatTurn, raw: ResponsesRequest, started: TurnStarted
) -> _Events:
    return _Events(_echo(raw), started)


_API = one_sample(parse_request, _whole, _streamed, errors.RESPONSES, sse.RESPONSES)


def router() -> APIRouter:
    routes = APIRouter()
    http.post_both_ways(routes, "/v1/responses", _API.serve)
    return routes
