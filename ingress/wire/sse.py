"""Server-sent events of the chat APIs: one writer frames, ends and fails every stream.

Invariants:
- A stream is its opening events, then what each turn event renders to, in the order the
  service yields them, each sent as soon as it is rendered (no buffering, here or in a proxy).
- Its end marker (OpenAI chat's ``data: [DONE]``) follows only a stream that ran out, which
  the service lets happen only after :class:`~ingress.turns.service.TurnDone`, i.e. after the step
  is durable.
- A :class:`~titoflow.errors.TitoflowError` after the status line ends the stream with the
  API's error event and no end marker, so no client takes a failed turn for a whole one.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from fastapi.responses import StreamingResponse

from titoflow.errors import TitoflowError

Payload = dict[str, Any]
Frame = Callable[[Payload], str]


def data_event(payload: Payload) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def named_event(payload: Payload) -> str:
    """An event named by its payload's ``type``, as Anthropic and Responses name theirs."""
    return f"event: {payload['type']}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"


def numbered_events() -> Frame:
    """Named events that carry their place in the stream (``sequence_number``), as Responses'."""
    numbers = itertools.count()
    return lambda payload: named_event({**payload, "sequence_number": next(numbers)})


@dataclass(frozen=True)
class Framing:
    """How one API frames a stream: ``framer`` makes each stream's framer (numbering is per
    stream); ``end`` is the line after the last event of a complete stream."""

    framer: Callable[[], Frame]
    end: str | None = None


OPENAI_CHAT = Framing(lambda: data_event, "data: [DONE]\n\n")
ANTHROPIC = Framing(lambda: named_event)
RESPONSES = Framing(numbered_events)


E = TypeVar("E", contravariant=True)
Event = TypeVar("Event")


class EventRenderer(Protocol[E]):
    """One stream's events in an API's wire shape, built from the turn's events (each a
    :data:`~ingress.turns.service.TurnEvent`; with ``n`` samples, a
    :class:`~ingress.turns.service.SampleEvent`)."""

    def opening(self) -> Iterable[Payload]: ...

    def render(self, event: E) -> Iterable[Payload]: ...


async def write(
    framing: Framing,
    renderer: EventRenderer[Event],
    events: AsyncIterator[Event],
    error_event: Callable[[TitoflowError], Payload],
) -> AsyncIterator[str]:
    frame, render = framing.framer(), renderer.render  # bound once: this loop runs per token
    for payload in renderer.opening():
        yield frame(payload)
    try:
        async for event in events:
            for payload in render(event):
                yield frame(payload)
    except TitoflowError as exc:  # the status line is gone: the error goes into the stream
        yield frame(error_event(exc))
        return
    if framing.end:
        yield framing.end


def response(frames: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(
        frames,
        media_type="text/event-stream",
        # Each event as it is written: no cache, and no buffering in nginx-style proxies.
        headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
    )
