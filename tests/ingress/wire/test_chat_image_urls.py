"""Images given by http(s) URL through the OpenAI chat, Anthropic messages and Responses routes
(issue 30), with the official SDKs, in-process on the SCRIPTED ENGINE DOUBLE and the tiny
Qwen3-VL policy's tokenizer, template and processor config; the images are served over real
HTTP by a small app on 127.0.0.1 in this process (no other network). An image fetched from a URL
gives the prompt, the engine call and the record the same image sent inline gives; every refusal
(fetching off, a host not allowed, a redirect too many or to another host, a timeout, an HTTP
error, too many bytes, no image) is a 400 in the API's own shape naming the URL, with nothing
published and no engine call; a request refused before the service fetches nothing, and a
history's image is fetched once. Also here: count_tokens counts each image's expanded run, a
data: URL is read once per replica, and the cache of read images keeps its bound. The real VL
engine's check is in tests/e2e/test_e2e_chat_images.py."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import anthropic
import openai
import pytest
from fastapi import FastAPI
from fastapi.responses import RedirectResponse, Response, StreamingResponse
from hypothesis import given
from hypothesis import strategies as st

from ingress.turns.image_cache import ImageCache
from ingress.turns.service import ServiceOptions
from ingress.turns.turn import SessionRef
from ingress.wire import openai_responses
from ingress.wire.http import session_key
from tests.support.apps import asgi_client, serving
from tests.support.chat_images import (
    OPTIONS,
    PROCESSING,
    client_for,
    png,
    vl_app,
    vl_options,
)
from tests.support.doubles import RecordingPublisher, ScriptedEngine
from titoflow.settings import Settings
from titoflow.tito.messages import MessageImage
from titoflow.tito.prompt_images import read_image

A, B = png(100, 50), png(64, 96, (200, 10, 10))
SCREENS = (png(80, 40, (10, 200, 10)), png(40, 80, (10, 10, 200)))


class ImageServer:
    """Images and failures at fixed paths; ``hits`` counts the requests of each path."""

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        self.app = FastAPI()
        self.url = ""
        images = {"a.png": A, "b.png": B}
        app = self.app

        @app.middleware("http")
        async def count(request: Any, call_next: Any) -> Any:
            self.hits[request.url.path] += 1
            return await call_next(request)

        @app.get("/img/{name}")
        async def image(name: str) -> Response:
            return Response(images[name], media_type="image/png")

        @app.get("/to/{name}")
        async def redirect(name: str) -> Response:
            return RedirectResponse(f"/img/{name}", status_code=302)

        @app.get("/screen")
        async def screen() -> Response:  # one path, new content on every fetch
            return Response(SCREENS[(self.hits["/screen"] - 1) % 2], media_type="image/png")

        @app.get("/loop")
        async def loop() -> Response:
            return RedirectResponse("/loop", status_code=302)

        @app.get("/away")
        async def away() -> Response:  # from an allowed host (localhost) to another (127.0.0.1)
            return RedirectResponse(f"{self.url}/img/a.png", status_code=302)

        @app.get("/slow")
        async def slow() -> Response:
            await asyncio.sleep(1)
            return Response(A, media_type="image/png")

        @app.get("/missing")
        async def missing() -> Response:
            return Response("gone", status_code=404)

        @app.get("/page")
        async def page() -> Response:
            return Response("<html>an error page</html>", media_type="text/html")

        @app.get("/big")
        async def big() -> Response:  # declares its length
            return Response(b"\0" * 5000, media_type="image/png")

        @app.get("/endless")
        async def endless() -> Response:  # no Content-Length: only reading it tells its size
            async def chunks() -> AsyncIterator[bytes]:
                for _ in range(100):
                    yield b"\0" * 1000

            return StreamingResponse(chunks(), media_type="image/png")


@asynccontextmanager
async def image_server() -> AsyncIterator[ImageServer]:
    server = ImageServer()
    async with serving(server.app) as url:
        server.url = url
        yield server


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


# Each API's request with one image given by ``url``, sent by its SDK.
async def ask_chat(app: Any, url: str, stream: bool) -> None:
    content = [{"type": "text", "text": "see "}, {"type": "image_url", "image_url": {"url": url}}]
    messages: Any = [{"role": "user", "content": content}]
    answer = await client_for(app).chat.completions.create(
        model="m", messages=messages, stream=stream
    )
    if stream:
        assert [chunk async for chunk in answer][-1].choices[0].finish_reason  # type: ignore[union-attr]


async def ask_anthropic(app: Any, url: str, stream: bool) -> None:
    source = (
        {"type": "base64", "media_type": "image/png", "data": url.partition(",")[2]}
        if url.startswith("data:")
        else {"type": "url", "url": url}
    )
    content = [{"type": "text", "text": "see "}, {"type": "image", "source": source}]
    messages: Any = [{"role": "user", "content": content}]
    answer = await anthropic_client(app).messages.create(
        model="m", max_tokens=16, messages=messages, stream=stream
    )
    if stream:
        assert [event.type async for event in answer][-1] == "message_stop"  # type: ignore[union-attr]


async def ask_responses(app: Any, url: str, stream: bool) -> None:
    content = [{"type": "input_text", "text": "see "}, {"type": "input_image", "image_url": url}]
    items: Any = [{"role": "user", "content": content}]
    answer = await client_for(app).responses.create(model="m", input=items, stream=stream)
    if stream:
        assert [event.type async for event in answer][-1] == "response.completed"  # type: ignore[union-attr]


ASK: dict[str, Callable[[Any, str, bool], Any]] = {
    "openai.chat": ask_chat,
    "anthropic.messages": ask_anthropic,
    "openai.responses": ask_responses,
}


def anthropic_client(app: Any) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url="http://ingress/sess/s1", api_key="k", http_client=asgi_client(app), max_retries=0
    )


def sent(engine: ScriptedEngine) -> list[Any]:
    return [
        (image.offset, image.length, image.uuid, image.url) for image in engine.params[0].images
    ]


def recorded(publisher: RecordingPublisher) -> tuple[list[int], list[Any]]:
    [step] = publisher.steps()
    return step.prompt_tail_ids, step.new_messages


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", list(ASK))
async def test_an_image_url_gives_what_the_same_image_inline_gives(api: str, stream: bool) -> None:
    """Fetched, the image is its bytes as a data: URL: the same prompt, the same engine images
    (uuid, run, the data: URL sent) and the same record as the image sent inline."""
    inline, inline_engine, inline_publisher = vl_app(["ok<|im_end|>"])
    await ASK[api](inline, data_url(A), stream)
    async with image_server() as server:
        app, engine, publisher = vl_app(["ok<|im_end|>"])
        await ASK[api](app, f"{server.url}/to/a.png", stream)  # through a redirect
    assert engine.prompts == inline_engine.prompts
    assert sent(engine) == sent(inline_engine)
    assert sent(engine)[0][1:3] == (PROCESSING.tokens(50, 100), hashlib.sha256(A).hexdigest())
    assert sent(engine)[0][3].startswith("data:image/png;base64,")
    assert recorded(publisher) == recorded(inline_publisher)
    assert server.hits == {"/to/a.png": 1, "/img/a.png": 1}


async def two_turns(app: Any, first: str, second: str) -> None:
    """A chat turn showing the image at URL ``first``, then one extending it with ``second``."""
    client = client_for(app)
    shown = {"type": "image_url", "image_url": {"url": first}}
    messages: Any = [{"role": "user", "content": [shown]}]
    answer = await client.chat.completions.create(model="m", messages=messages)
    then = {"type": "image_url", "image_url": {"url": second}}
    messages += [
        answer.choices[0].message.model_dump(exclude_none=True),
        {"role": "user", "content": [{"type": "text", "text": "and "}, then]},
    ]
    await client.chat.completions.create(model="m", messages=messages)


async def test_a_history_image_is_fetched_once_and_the_next_turn_extends_its_chain() -> None:
    async with image_server() as server:
        app, engine, publisher = vl_app(["seen<|im_end|>", "and more<|im_end|>"])
        await two_turns(app, f"{server.url}/img/a.png", f"{server.url}/img/b.png")
    one, two = publisher.steps()
    assert (one.prefix, two.prefix) == ("rendered", "tito")
    assert [(i.by_uuid, i.url.startswith("data:")) for i in engine.params[1].images] == [
        (True, True),
        (False, True),
    ]
    assert server.hits == {"/img/a.png": 1, "/img/b.png": 1}


async def test_a_new_turn_fetches_its_url_again_and_the_history_keeps_what_it_was_shown() -> None:
    """A screenshot written to one path every turn: the new turn's image is the path's new
    content (fetched on that call, as the API would), while the history's image stays the one
    its turn was rendered with, so the call still extends its chain."""
    async with image_server() as server:
        app, engine, publisher = vl_app(["seen<|im_end|>", "and more<|im_end|>"])
        await two_turns(app, f"{server.url}/screen", f"{server.url}/screen")
    one, two = publisher.steps()
    assert (one.prefix, two.prefix) == ("rendered", "tito")
    first, second = (hashlib.sha256(shot).hexdigest() for shot in SCREENS)
    assert [(i.uuid, i.by_uuid) for i in engine.params[1].images] == [
        (first, True),
        (second, False),
    ]
    assert [i.sha256 for i in two.images] == [first, second]
    assert server.hits == {"/screen": 2}


async def test_a_request_refused_before_the_service_fetches_nothing() -> None:
    async with image_server() as server:
        app, engine, publisher = vl_app(["never<|im_end|>"])
        app.state.settings = Settings(accepted_models="m")
        content: Any = [{"type": "image_url", "image_url": {"url": f"{server.url}/img/a.png"}}]
        with pytest.raises(openai.NotFoundError):
            await client_for(app).chat.completions.create(
                model="other", messages=[{"role": "user", "content": content}]
            )
        no_vl, *_ = vl_app(
            ["never<|im_end|>"], ServiceOptions(max_model_len=4096, default_max_tokens=64)
        )
        with pytest.raises(openai.BadRequestError, match="reads no images"):
            await client_for(no_vl).chat.completions.create(
                model="m", messages=[{"role": "user", "content": content}]
            )
    assert server.hits == {} and publisher.events == [] and engine.prompts == []


REFUSING = vl_options(max_image_bytes=3000, image_url_timeout_s=0.3, image_url_max_redirects=2)


@pytest.mark.parametrize(
    ("path", "options", "says"),
    [
        ("/img/a.png", replace(REFUSING, image_url_fetch=False), "image_url_fetch"),
        (
            "/img/a.png",
            replace(REFUSING, image_url_allowed_domains=frozenset({"localhost"})),
            "names the host '127.0.0.1', not an allowed domain",
        ),
        ("/loop", REFUSING, "more than 2 redirects"),
        ("/slow", REFUSING, "not fetched within 0.3 s"),
        ("/missing", REFUSING, "answered HTTP 404"),
        ("/page", REFUSING, "not an image"),
        ("/big", REFUSING, "too large"),
        ("/endless", REFUSING, "too large"),
    ],
)
@pytest.mark.parametrize("api", list(ASK))
async def test_a_refused_image_url_is_a_400_in_the_api_s_shape_and_publishes_nothing(
    api: str, path: str, options: ServiceOptions, says: str
) -> None:
    async with image_server() as server:
        app, engine, publisher = vl_app(["never<|im_end|>"], options)
        url = f"{server.url}{path}"
        error: type[Exception] = (
            anthropic.BadRequestError if api == "anthropic.messages" else openai.BadRequestError
        )
        with pytest.raises(error) as refused:
            await ASK[api](app, url, False)
    body: Any = refused.value.body  # type: ignore[attr-defined]
    if api == "anthropic.messages":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        message = body["error"]["message"]
    else:
        assert body["type"] == "invalid_request_error"
        assert body["param"] == ("input" if api == "openai.responses" else "messages")
        message = body["message"]
    assert message.startswith(f"the image at {url}: ") and says in message
    assert publisher.events == [] and engine.prompts == []


async def test_a_redirect_to_a_host_not_allowed_is_refused() -> None:
    async with image_server() as server:
        allowed = frozenset({"localhost"})
        app, engine, publisher = vl_app(
            ["never<|im_end|>"], replace(OPTIONS, image_url_allowed_domains=allowed)
        )
        url = server.url.replace("127.0.0.1", "localhost") + "/away"
        with pytest.raises(openai.BadRequestError) as refused:
            await ask_chat(app, url, False)
    assert f"redirected to {server.url}/img/a.png, which names the host '127.0.0.1'" in (
        refused.value.message
    )
    assert server.hits == {"/away": 1} and publisher.events == [] and engine.prompts == []


# --- count_tokens --------------------------------------------------------------------------


@pytest.mark.parametrize("by_url", [False, True])
async def test_count_tokens_counts_each_image_s_expanded_run(by_url: bool) -> None:
    async with image_server() as server:
        app, engine, _ = vl_app(["ok<|im_end|>"])
        source = (
            {"type": "url", "url": f"{server.url}/img/a.png"}
            if by_url
            else {
                "type": "base64",
                "media_type": "image/png",
                "data": data_url(A).partition(",")[2],
            }
        )
        messages: Any = [
            {
                "role": "user",
                "content": [{"type": "image", "source": source}, {"type": "text", "text": "hi"}],
            }
        ]
        client = anthropic_client(app)
        counted = await client.messages.count_tokens(model="m", messages=messages)
        await client.messages.create(model="m", max_tokens=8, messages=messages)
    assert counted.input_tokens == len(engine.prompts[0])
    assert PROCESSING.tokens(50, 100) > 1  # so a placeholder counted as one would be short


async def test_with_session_keys_count_tokens_fetches_nothing_without_its_session_s_key() -> None:
    """count_tokens opens no session, but it fetches the URLs it is sent: with session keys on,
    it takes its session's key like a turn, and is refused before any fetch without it."""
    keyed = Settings(driver_token="driver-secret", implicit_sessions=False)
    async with image_server() as server:
        image = {"type": "image", "source": {"type": "url", "url": f"{server.url}/img/a.png"}}
        messages: Any = [{"role": "user", "content": [image, {"type": "text", "text": "hi"}]}]
        app, engine, _ = vl_app(["ok<|im_end|>"], settings=keyed)

        def client(base: str, key: str) -> anthropic.AsyncAnthropic:
            return anthropic.AsyncAnthropic(
                base_url=base, api_key=key, http_client=asgi_client(app), max_retries=0
            )

        with pytest.raises(anthropic.AuthenticationError):
            await client("http://ingress/sess/s1", "guess").messages.count_tokens(
                model="m", messages=messages
            )
        other = session_key("driver-secret", "s2")  # a key, of another session
        with pytest.raises(anthropic.AuthenticationError):
            await client("http://ingress/sess/s1", other).messages.count_tokens(
                model="m", messages=messages
            )
        with pytest.raises(anthropic.BadRequestError) as unnamed:
            await client("http://ingress", other).messages.count_tokens(
                model="m", messages=messages
            )
        assert server.hits == {}  # refused before anything was fetched
        own = client("http://ingress/sess/s1", session_key("driver-secret", "s1"))
        counted = await own.messages.count_tokens(model="m", messages=messages)
    assert "no session" in unnamed.value.message
    assert server.hits == {"/img/a.png": 1} and counted.input_tokens > 1
    assert engine.prompts == []  # counting sends nothing to the engine


# --- the cache of read images -----------------------------------------------------------------


def test_a_data_url_is_read_once_per_replica_and_placed_where_it_stands(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Responses API re-sends its input, images included, on every call: the second call
    takes the image read on the first, at its own place in the text."""
    reads: list[str] = []

    def counted(url: str, at: int) -> MessageImage:
        reads.append(url)
        return read_image(url, at)

    monkeypatch.setattr("ingress.wire.adapter.read_image", counted)
    url = data_url(png(33, 17))  # no other test sends it

    def parsed(text: str) -> MessageImage:
        content = [{"type": "input_text", "text": text}, {"type": "input_image", "image_url": url}]
        body = {"model": "m", "input": [{"role": "user", "content": content}]}
        [message] = openai_responses.parse_request(body, SessionRef(session_id="s"))[0].messages
        [image] = message.images
        return image

    first, second = parsed("a"), parsed("longer")
    assert reads == [url]
    assert (first.at, second.at) == (1, 6)
    assert first.model_copy(update={"at": 6}) == second
    assert second.sha256 == hashlib.sha256(png(33, 17)).hexdigest()


@given(st.lists(st.tuples(st.sampled_from("abcdef"), st.integers(1, 40)), max_size=30))
def test_the_image_cache_keeps_its_bound_and_the_most_recent_images(
    puts: list[tuple[str, int]],
) -> None:
    """Against a model: an LRU of URLs whose weight (the URL, and the data: URL an http URL was
    read into) never exceeds the bound."""
    cache = ImageCache(max_chars=60)
    model: dict[str, int] = {}  # url -> weight, in recency order
    for name, size in puts:
        url = f"http://h/{name}"
        image = MessageImage(at=0, sha256=name, height=1, width=1, url="d" * size)
        if cache.get(url) is not None:
            model[url] = model.pop(url)
            continue
        cache.put(url, image)
        weight = len(url) + size
        if weight <= 60:
            model[url] = weight
            while sum(model.values()) > 60:
                del model[next(iter(model))]
        assert cache.size == sum(model.values()) <= 60
    assert {url for url in model if cache.get(url) is not None} == set(model)
