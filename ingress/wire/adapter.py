"""What the three chat adapters (OpenAI chat, Anthropic messages, OpenAI responses) share: the
route every one of them serves, text parts and token counts. Each adapter is then only its wire
shapes: a parser to :class:`~ingress.turns.turn.ChatTurn` and renderers of the service's answer.

Invariant: every chat API answers a request in the same order — a bounded body, its session
resolved (and its key checked), the body parsed into a turn of that session, its model checked,
then the service: a whole answer once every sample's step is durable, or a stream once the
turn is prepared
(:meth:`~ingress.turns.service.ChatService.open_stream` refuses before the status line). Every error
up to the status line is answered in the API's own shape (:mod:`ingress.wire.errors`), every later
one inside the stream (:mod:`ingress.wire.sse`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Generic, Protocol, TypeVar

from fastapi import Request
from fastapi.responses import Response
from pydantic import Field

from ingress.turns.image_cache import DATA_IMAGES
from ingress.turns.service import SampleEvent, TurnEvent, TurnResult, TurnStarted
from ingress.turns.turn import ChatTurn, SessionRef
from ingress.wire import http, sse
from ingress.wire.errors import ErrorShape
from titoflow.errors import InvalidRequest, TitoflowError
from titoflow.tito.messages import MessageImage
from titoflow.tito.prompt_images import image_to_fetch, is_http_url, read_image


class _Streamable(Protocol):
    @property
    def stream(self) -> bool: ...


Raw = TypeVar("Raw", bound=_Streamable)


@dataclass(frozen=True)
class TurnApi(Generic[Raw]):
    """One chat API: ``parse`` turns a body of a resolved session into the turn and the
    validated request (``Raw``); ``whole`` renders the turn's durable results (one per sample,
    in sample order), ``streamed`` its stream's events (each with its sample's index);
    ``errors`` and ``framing`` are the API's error shape and SSE framing (an API without ``n``
    wraps its one-sample renderers with :func:`one_sample`). :meth:`serve` is its route."""

    parse: Callable[[Any, SessionRef], tuple[ChatTurn, Raw]]
    whole: Callable[[Request, ChatTurn, Raw, list[TurnResult]], dict[str, Any]]
    streamed: Callable[[Request, ChatTurn, Raw, TurnStarted], sse.EventRenderer[SampleEvent]]
    errors: ErrorShape
    framing: sse.Framing

    async def serve(self, request: Request, session: str | None) -> Response:
        try:
            body = await http.read_json(request)
            turn, raw = self.parse(body, http.session_of(request, session, body))
            http.check_model(request, turn.model)
            service = http.service(request)
            if raw.stream:
                started, events = await service.open_stream(turn)
                renderer = self.streamed(request, turn, raw, started)
                return sse.response(sse.write(self.framing, renderer, events, self.errors.event))
            results = await service.complete(turn)
            return http.json_response(self.whole(request, turn, raw, results))
        except TitoflowError as exc:
            return self.errors.response(exc)


class _OneSample:
    """A one-sample API's renderer of a turn's events, read as the events of its one sample."""

    def __init__(self, renderer: sse.EventRenderer[TurnEvent]) -> None:
        self.opening = renderer.opening
        self._render = renderer.render

    def render(self, event: SampleEvent) -> Iterable[sse.Payload]:
        return self._render(event.event)


def one_sample(
    parse: Callable[[Any, SessionRef], tuple[ChatTurn, Raw]],
    whole: Callable[[Request, ChatTurn, Raw, TurnResult], dict[str, Any]],
    streamed: Callable[[Request, ChatTurn, Raw, TurnStarted], sse.EventRenderer[TurnEvent]],
    errors: ErrorShape,
    framing: sse.Framing,
) -> TurnApi[Raw]:
    """The :class:`TurnApi` of an API without ``n`` (its turns have one sample), from its
    renderers of that sample."""
    return TurnApi(
        parse,
        lambda request, turn, raw, results: whole(request, turn, raw, results[0]),
        lambda request, turn, raw, started: _OneSample(streamed(request, turn, raw, started)),
        errors,
        framing,
    )


# Tool names as OpenAI and Anthropic accept them (letters, digits, '_' and '-', up to 64: every
# scaffold's, Claude Code's mcp__server__tool included), widened to what MCP allows (dots, up
# to 128). A name reaches the template and the tool-call parser as it came.
ToolName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,128}$")]


class TextPart(http.Lenient):
    """A content part of OpenAI's message content (chat and responses)."""

    type: str
    text: str = ""
    image_url: Any = None  # an image part's: OpenAI chat's {"url": ...}, Responses' the URL


def text_of(
    content: str | Sequence[TextPart] | None,
    accepted: frozenset[str],
    param: str,
    param_in_message: bool = False,
) -> str:
    """A message content's text: a string as it is, ``accepted`` parts joined. Any other part
    (an image, a file) is a 400 naming ``param``: the policy reads text only."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    unsupported = sorted({part.type for part in content} - accepted)
    if unsupported:
        message = f"unsupported content part types: {unsupported}"
        raise InvalidRequest(f"{param}: {message}" if param_in_message else message, param)
    return "".join(part.text for part in content)


def has_image(content: str | Sequence[TextPart] | None, image_type: str) -> bool:
    """Whether a message content holds a part of ``image_type``."""
    return isinstance(content, list) and any(part.type == image_type for part in content)


def content_with_images(
    content: Sequence[TextPart], accepted: frozenset[str], param: str, image_type: str
) -> tuple[str, tuple[MessageImage, ...]]:
    """A content of text and image parts (``image_type``: OpenAI chat's ``image_url``, the
    Responses API's ``input_image``): its text (``accepted`` parts joined) and its images, each
    at the point of the text it stands (:func:`image_at` reads them). A part of another type, an
    image with no URL, or one that is neither a ``data:`` URL of an image nor an http(s) URL is
    a 400 naming the part."""
    text = ""
    images: list[MessageImage] = []
    for index, part in enumerate(content):
        if part.type in accepted:
            text += part.text
            continue
        at = f"{param}.{index}"
        if part.type != image_type:
            raise InvalidRequest(f"unsupported content part type: {part.type!r}", at)
        url = part.image_url.get("url") if isinstance(part.image_url, dict) else part.image_url
        images.append(image_at(url, len(text), f"{at}.image_url"))
    return text, tuple(images)


def image_at(url: Any, at: int, param: str) -> MessageImage:
    """The image of ``url`` standing at character ``at`` of its message's text: a ``data:``
    URL read (once per replica: :data:`~ingress.turns.image_cache.DATA_IMAGES`), an http(s) URL to
    be fetched before the turn is rendered (ingress/turns/image_urls.py); a 400 naming ``param`` for
    any other URL or a ``data:`` URL of no image."""
    if not isinstance(url, str):
        raise InvalidRequest(f"{param}: an image needs its url", param)
    if url[:5].lower() != "data:":
        if not is_http_url(url):
            raise InvalidRequest(
                f"{param}: an image URL must be a data: URL (base64 image bytes) or an http(s) "
                f"URL; got {url[:64]!r}",
                param,
            )
        return image_to_fetch(url, at)
    known = DATA_IMAGES.get(url)
    if known is not None:
        return known if known.at == at else known.model_copy(update={"at": at})
    try:
        image = read_image(url, at)
    except ValueError as exc:
        raise InvalidRequest(f"{param}: {exc}", param) from exc
    DATA_IMAGES.put(url, image)
    return image


def token_counts(result: TurnResult) -> tuple[int, int]:
    """A turn's prompt and generated tokens: what every API's usage reports, in its own names."""
    return result.prompt_len, len(result.generation.token_ids)
