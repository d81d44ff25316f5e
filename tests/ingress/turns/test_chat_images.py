"""Images through the OpenAI chat, Responses and Anthropic messages routes (issue 30, part 2), with
the official SDKs, in-process on the SCRIPTED ENGINE DOUBLE and the tiny Qwen3-VL policy's
tokenizer, template and processor config: a ``data:`` URL image part (an Anthropic base64 block)
becomes one placeholder in the rendered prompt, expanded to the image's run
(titoflow/tito/image_grid.py) in the chain and the step; the engine call carries the images (new
ones with their bytes, the chain's by uuid alone); the next turn is TITO; a text request on the
same app takes the text path; and every refusal is a 400 with nothing published. The same path on
the real VL engine is tests/e2e/test_e2e_chat_images.py."""

from __future__ import annotations

import base64
import hashlib
from dataclasses import replace
from typing import Any

import anthropic
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cli.dev.vl_policy import IMAGE_PAD_ID
from ingress.turns.service import ServiceOptions
from ingress.turns.turn import SessionRef, TokenCall
from tests.support.apps import asgi_client
from tests.support.chat_images import (
    CALL,
    OPTIONS,
    PROCESSING,
    TOOLS,
    client_for,
    image_part,
    png,
    vl_app,
    vl_options,
    vl_tokenizer,
)
from tests.support.families import qwen3
from tests.support.image_samples import runs
from titoflow.errors import TemplateError
from titoflow.tito.messages import Message, MessageImage
from titoflow.tito.render import ChatRenderer
from workers.rebuild import Rebuilder


async def test_two_turns_with_images_expand_in_the_chain_and_continue_by_tito() -> None:
    """Turn 1: a user message with an image (not streamed); turn 2: the tool result holding a
    screenshot (streamed). Each step's prompt is the engine's, with every image's expanded run;
    turn 2 extends turn 1's chain, sending the first image by uuid alone."""
    app, engine, publisher = vl_app([CALL, "I see it.<|im_end|>"])
    client = client_for(app)
    first, second = png(100, 50), png(64, 96, (200, 10, 10))
    messages: Any = [
        {"role": "user", "content": [{"type": "text", "text": "look: "}, image_part(first)]}
    ]
    answer = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    call = answer.choices[0].message.tool_calls[0]  # type: ignore[index]
    messages += [
        answer.choices[0].message.model_dump(exclude_none=True),
        {
            "role": "tool",
            "tool_call_id": call.id,
            "content": [image_part(second), {"type": "text", "text": "the screen"}],
        },
    ]
    stream = await client.chat.completions.create(
        model="m", messages=messages, tools=TOOLS, stream=True
    )
    text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream])
    assert text == "I see it."

    one, two = publisher.steps()
    lengths = [PROCESSING.tokens(50, 100), PROCESSING.tokens(96, 64)]
    assert lengths == [6, 6]
    assert one.prefix == "rendered" and two.prefix == "tito"
    assert two.prefix_len == len(one.prompt_tail_ids) + len(one.completion_ids)
    assert one.prompt_tail_ids == engine.prompts[0]
    chain = one.prompt_tail_ids + one.completion_ids
    assert engine.prompts[1] == chain + two.prompt_tail_ids
    first_run = runs(engine.prompts[0])
    assert [length for _, length in first_run] == lengths[:1]
    both = runs(engine.prompts[1])
    assert both[0] == first_run[0] and [length for _, length in both] == lengths
    sent = [
        (i.offset, i.length, i.uuid, i.by_uuid) for params in engine.params for i in params.images
    ]
    digest = [hashlib.sha256(first).hexdigest(), hashlib.sha256(second).hexdigest()]
    assert sent == [
        (*first_run[0], digest[0], False),
        (*both[0], digest[0], True),
        (*both[1], digest[1], False),
    ]
    # The record names images by hash: no bytes in the step event.
    recorded = [part for m in one.new_messages + two.new_messages for part in m["content"]]
    assert [p["image"] for p in recorded if p["type"] == "image"] == [f"sha256:{d}" for d in digest]
    assert "base64" not in one.model_dump_json() + two.model_dump_json()


async def test_the_continuation_equals_the_whole_conversation_rendered() -> None:
    """A client that lost nothing and a replica that lost its cache send the same prompt."""
    app, engine, _ = vl_app([CALL, "ok<|im_end|>"])
    messages: Any = [{"role": "user", "content": [image_part(png(200, 120))]}]
    answer = await client_for(app).chat.completions.create(
        model="m", messages=messages, tools=TOOLS
    )
    messages += [
        answer.choices[0].message.model_dump(exclude_none=True),
        {"role": "user", "content": [{"type": "text", "text": "and "}, image_part(png(32, 32))]},
    ]
    await client_for(app).chat.completions.create(model="m", messages=messages, tools=TOOLS)
    fresh, fresh_engine, _ = vl_app(["ok<|im_end|>"])
    await client_for(fresh).chat.completions.create(model="m", messages=messages, tools=TOOLS)
    assert engine.prompts[1] == fresh_engine.prompts[0]
    assert [i.length for i in fresh_engine.params[0].images] == [
        PROCESSING.tokens(120, 200),
        PROCESSING.tokens(32, 32),
    ]


async def test_a_text_request_sends_no_images() -> None:
    app, engine, _ = vl_app(["hi<|im_end|>"])
    await client_for(app).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hello"}]
    )
    assert engine.params[0].images == () and IMAGE_PAD_ID not in engine.prompts[0]


IMAGE = image_part(png(40, 40))
NO_VL = ServiceOptions(max_model_len=4096, default_max_tokens=64)


@pytest.mark.parametrize(
    ("messages", "options", "says"),
    [
        ([{"role": "user", "content": [IMAGE]}], NO_VL, "reads no images"),
        (
            [{"role": "user", "content": [IMAGE] * 3}],
            vl_options(max_images=2),
            "at most 2",
        ),
        (
            [{"role": "user", "content": [IMAGE]}],
            vl_options(max_image_bytes=10),
            "max_image_bytes_per_request",
        ),
        (
            [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "ftp://x/a.png"}}],
                }
            ],
            OPTIONS,
            "or an http(s) URL",
        ),
        (
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
                    ],
                }
            ],
            OPTIONS,
            "not an image",
        ),
        ([{"role": "user", "content": [{"type": "image_url"}]}], OPTIONS, "needs its url"),
        (
            [{"role": "system", "content": [IMAGE]}, {"role": "user", "content": "hi"}],
            OPTIONS,
            "only user and tool messages",
        ),
        (
            [{"role": "user", "content": [{"type": "text", "text": "<|image_pad|>"}, IMAGE]}],
            OPTIONS,
            "2 image placeholder",
        ),
    ],
)
async def test_refused_images_are_a_400_and_publish_nothing(
    messages: Any, options: ServiceOptions, says: str
) -> None:
    app, engine, publisher = vl_app(["never<|im_end|>"], options)
    with pytest.raises(openai.BadRequestError) as refused:
        await client_for(app).chat.completions.create(model="m", messages=messages)
    assert says in refused.value.message
    assert refused.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    assert publisher.events == [] and engine.prompts == []


LIMITED = {
    "count": (
        replace(OPTIONS, max_images=1),
        "at most 1 are taken (setting max_images_per_request)",
    ),
    "bytes": (
        replace(OPTIONS, max_image_bytes=len(png(40, 40))),
        "(setting max_image_bytes_per_request)",
    ),
}


@pytest.mark.parametrize("limit", sorted(LIMITED))
@pytest.mark.parametrize("api", ["chat", "responses", "anthropic"])
async def test_the_image_limits_count_the_whole_conversation_and_refuse_in_each_api_s_shape(
    api: str, limit: str
) -> None:
    """A first turn at the limit is taken; the next, adding an image, passes it (the limits
    hold the conversation, history included) and is a 400 in the API's own error shape, with
    no engine call and nothing published."""
    options, says = LIMITED[limit]
    app, engine, publisher = vl_app(["seen<|im_end|>", "never<|im_end|>"], options)
    first, second = png(40, 40), png(40, 40, (200, 10, 10))
    ask = {"chat": chat_turns, "responses": responses_turns, "anthropic": anthropic_turns}[api]
    with pytest.raises((openai.BadRequestError, anthropic.BadRequestError)) as refused:
        await ask(app, first, second)
    error = refused.value
    assert isinstance(error, openai.BadRequestError | anthropic.BadRequestError)
    assert says in error.message
    body: Any = error.body
    if api == "anthropic":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    else:
        # Each API names its own field: chat's messages, Responses' input.
        field = "input" if api == "responses" else "messages"
        assert body["type"] == "invalid_request_error" and body["param"] == field
    assert len(engine.prompts) == 1 and len(publisher.steps()) == 1  # the first turn's only


async def chat_turns(app: Any, first: bytes, second: bytes) -> None:
    client = client_for(app)
    messages: Any = [{"role": "user", "content": [image_part(first)]}]
    answer = await client.chat.completions.create(model="m", messages=messages)
    messages += [
        {"role": "assistant", "content": answer.choices[0].message.content},
        {"role": "user", "content": [image_part(second)]},
    ]
    await client.chat.completions.create(model="m", messages=messages)


async def responses_turns(app: Any, first: bytes, second: bytes) -> None:
    client = client_for(app)
    url = [image_part(data)["image_url"]["url"] for data in (first, second)]
    items: Any = [
        {
            "role": "user",
            "content": [{"type": "input_image", "image_url": url[0], "detail": "auto"}],
        }
    ]
    answer = await client.responses.create(model="m", input=items)
    items += [item.model_dump(exclude_none=True) for item in answer.output]
    items.append(
        {
            "role": "user",
            "content": [{"type": "input_image", "image_url": url[1], "detail": "auto"}],
        }
    )
    await client.responses.create(model="m", input=items)


async def anthropic_turns(app: Any, first: bytes, second: bytes) -> None:
    client = anthropic.AsyncAnthropic(
        base_url="http://ingress/sess/s1", api_key="k", http_client=asgi_client(app), max_retries=0
    )
    messages: Any = [{"role": "user", "content": [anthropic_image(first)]}]
    answer = await client.messages.create(model="m", max_tokens=8, messages=messages)
    messages += [
        {"role": "assistant", "content": [block.model_dump() for block in answer.content]},
        {"role": "user", "content": [anthropic_image(second)]},
    ]
    await client.messages.create(model="m", max_tokens=8, messages=messages)


@given(
    st.text(max_size=12),
    st.lists(st.tuples(st.integers(0, 12), st.sampled_from("ab")), max_size=3),
)
def test_a_message_with_images_reads_back_from_its_record(
    text: str, placed: list[tuple[int, str]]
) -> None:
    """What a step records of a message (template_dict, hashes only) gives back its text and
    where each image stands; moving or changing an image changes the match key."""
    images = tuple(
        MessageImage(at=min(at, len(text)), sha256=name * 64, height=32, width=64)
        for at, name in sorted(placed)
    )
    message = Message(role="user", content=text, images=images)
    back = Message.from_template_dict(message.template_dict())
    assert back.content == text
    assert [(i.at, i.sha256, i.height, i.width) for i in back.images] == [
        (i.at, i.sha256, i.height, i.width) for i in images
    ]
    assert back.match_key("strict") == message.match_key("strict")
    if images:
        other = images[0].model_copy(update={"sha256": "c" * 64})
        changed = message.model_copy(update={"images": (other, *images[1:])})
        assert changed.match_key("strict") != message.match_key("strict")


async def test_a_white_box_call_extending_an_image_chain_sends_its_images_by_uuid() -> None:
    """The caller's ids hold the chain's expanded runs: without the images the engine would
    read the placeholders as plain tokens; its step records them, as a chat step does."""
    app, engine, publisher = vl_app(["seen<|im_end|>", "more"])
    data = png(64, 64)
    messages: Any = [{"role": "user", "content": [image_part(data)]}]
    await client_for(app).chat.completions.create(model="m", messages=messages)
    chain = engine.prompts[0] + qwen3().encode("seen<|im_end|>", add_special_tokens=False)
    service = app.state.service
    ref = SessionRef(session_id="s1")
    await service.generate_tokens(TokenCall(session=ref, model="m", prompt_ids=(*chain, 198)))
    [image] = engine.params[1].images
    assert engine.prompts[1] == [*chain, 198]
    assert (image.uuid, image.by_uuid) == (hashlib.sha256(data).hexdigest(), True)
    assert engine.prompts[1][image.offset : image.offset + image.length] == [IMAGE_PAD_ID] * 4
    chat, white_box = publisher.steps()
    assert white_box.api == "generate" and white_box.images == chat.images
    assert [(i.offset, i.length, i.grid_thw) for i in white_box.images] == [
        (image.offset, image.length, (1, 4, 4))
    ]


def anthropic_image(data: bytes) -> dict[str, Any]:
    source = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(data).decode()}
    return {"type": "image", "source": source}


async def test_anthropic_image_blocks_in_a_user_turn_and_a_tool_result() -> None:
    """The same path through Anthropic's messages API: an image block in the user's turn (not
    streamed), then a screenshot in the tool_result (streamed); the second turn is TITO and
    sends the first image by uuid alone."""
    app, engine, publisher = vl_app([CALL, "I see it.<|im_end|>"])
    client = anthropic.AsyncAnthropic(
        base_url="http://ingress/sess/s1", api_key="k", http_client=asgi_client(app), max_retries=0
    )
    tools: Any = [{"name": "screenshot", "input_schema": TOOLS[0]["function"]["parameters"]}]
    first, second = png(100, 50), png(64, 96, (200, 10, 10))
    messages: Any = [
        {"role": "user", "content": [{"type": "text", "text": "look"}, anthropic_image(first)]}
    ]
    answer = await client.messages.create(model="m", max_tokens=64, messages=messages, tools=tools)
    [use] = [block for block in answer.content if block.type == "tool_use"]
    messages += [
        {"role": "assistant", "content": [block.model_dump() for block in answer.content]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": use.id,
                    "content": [anthropic_image(second), {"type": "text", "text": "the screen"}],
                }
            ],
        },
    ]
    stream = await client.messages.create(
        model="m", max_tokens=64, messages=messages, tools=tools, stream=True
    )
    events = [event.type async for event in stream]
    assert events[-1] == "message_stop"

    one, two = publisher.steps()
    assert (one.prefix, two.prefix) == ("rendered", "tito")
    assert engine.prompts[1] == one.prompt_tail_ids + one.completion_ids + two.prompt_tail_ids
    digest = [hashlib.sha256(first).hexdigest(), hashlib.sha256(second).hexdigest()]
    sent = [(i.uuid, i.by_uuid, i.length) for p in engine.params for i in p.images]
    assert sent == [(digest[0], False, 6), (digest[0], True, 6), (digest[1], False, 6)]
    assert [length for _, length in runs(engine.prompts[1])] == [6, 6]


@pytest.mark.parametrize(
    ("messages", "says"),
    [
        (
            [
                {
                    "role": "user",
                    "content": [{"type": "image", "source": {"type": "url", "url": "file:///x"}}],
                }
            ],
            "or an http(s) URL",
        ),
        ([{"role": "user", "content": [anthropic_image(b"not a png")]}], "not an image"),
        (
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [anthropic_image(png(32, 32))]},
                {"role": "user", "content": "and?"},
            ],
            "assistant message cannot hold image blocks",
        ),
    ],
)
async def test_refused_anthropic_images_are_a_400_and_publish_nothing(
    messages: Any, says: str
) -> None:
    app, engine, publisher = vl_app(["never<|im_end|>"])
    client = anthropic.AsyncAnthropic(
        base_url="http://ingress/sess/s1", api_key="k", http_client=asgi_client(app), max_retries=0
    )
    with pytest.raises(anthropic.BadRequestError) as refused:
        await client.messages.create(model="m", max_tokens=8, messages=messages)
    assert says in refused.value.message
    assert publisher.events == [] and engine.prompts == []


async def test_responses_input_image_parts_in_a_message_and_a_function_output() -> None:
    """The same path through the Responses API: an ``input_image`` part in the user's message
    (not streamed), then one in the function call's output (streamed); TITO, first image by
    uuid alone."""
    app, engine, publisher = vl_app([CALL, "I see it.<|im_end|>"])
    client = client_for(app)
    function = TOOLS[0]["function"]
    tools: Any = [
        {"type": "function", "name": function["name"], "parameters": function["parameters"]}
    ]
    first, second = png(100, 50), png(64, 96, (200, 10, 10))
    url = [image_part(data)["image_url"]["url"] for data in (first, second)]
    items: Any = [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "look"},
                {"type": "input_image", "image_url": url[0], "detail": "auto"},
            ],
        }
    ]
    answer = await client.responses.create(model="m", input=items, tools=tools)
    [call] = answer.output
    assert call.type == "function_call"
    items += [
        call.model_dump(exclude_none=True),
        {
            "type": "function_call_output",
            "call_id": call.call_id,
            "output": [{"type": "input_image", "image_url": url[1]}],
        },
    ]
    stream = await client.responses.create(model="m", input=items, tools=tools, stream=True)
    assert [event.type async for event in stream][-1] == "response.completed"

    one, two = publisher.steps()
    assert (one.prefix, two.prefix) == ("rendered", "tito")
    assert engine.prompts[1] == one.prompt_tail_ids + one.completion_ids + two.prompt_tail_ids
    digest = [hashlib.sha256(first).hexdigest(), hashlib.sha256(second).hexdigest()]
    sent = [(i.uuid, i.by_uuid) for p in engine.params for i in p.images]
    assert sent == [(digest[0], False), (digest[0], True), (digest[1], False)]
    assert [length for _, length in runs(engine.prompts[1])] == [6, 6]


async def test_a_responses_image_in_an_assistant_message_is_a_400() -> None:
    app, engine, publisher = vl_app(["never<|im_end|>"])
    image = {"type": "input_image", "image_url": image_part(png(32, 32))["image_url"]["url"]}
    items: Any = [{"role": "assistant", "content": [image]}, {"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as refused:
        await client_for(app).responses.create(model="m", input=items)
    assert "only user messages may hold images" in refused.value.message
    assert publisher.events == [] and engine.prompts == []


async def test_a_worker_re_renders_a_conversation_with_images_to_the_engine_s_prompt() -> None:
    """A ``last-step`` segment re-renders the recorded messages (images named by hash, with
    their size): each image's placeholder becomes its run, so the re-render starts with the
    prompt the engine expanded."""
    app, engine, publisher = vl_app([CALL, "ok<|im_end|>"])
    client = client_for(app)
    messages: Any = [{"role": "user", "content": [image_part(png(100, 50))]}]
    answer = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    messages += [
        answer.choices[0].message.model_dump(exclude_none=True),
        {
            "role": "tool",
            "tool_call_id": (answer.choices[0].message.tool_calls or [])[0].id,
            "content": [image_part(png(64, 96))],
        },
    ]
    await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    one, two = publisher.steps()
    recorded = [*one.new_messages, one.response_message, *two.new_messages, two.response_message]
    rebuilder = Rebuilder(ChatRenderer(vl_tokenizer()), PROCESSING)
    tokens = rebuilder.render(recorded, one.tools, one.template_kwargs)
    assert tokens == engine.prompts[1] + two.completion_ids + [198]  # the template's last "\n"
    with pytest.raises(TemplateError):
        Rebuilder(ChatRenderer(vl_tokenizer())).render(recorded, one.tools, {})
