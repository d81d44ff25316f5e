"""A re-sent history is parsed once per replica; the cache never changes what a request means."""

from __future__ import annotations

import base64
import json
import tracemalloc
from typing import Any

import pytest

from ingress.turns.turn import SessionRef
from ingress.wire import anthropic_messages, openai_chat
from ingress.wire.known_messages import KnownMessages, Parsed
from titoflow.errors import InvalidRequest
from titoflow.tito.messages import Message

S = SessionRef(session_id="s")


class CountingParser:
    def __init__(self) -> None:
        self.seen: list[list[int]] = []

    def __call__(self, new: list[tuple[int, Any]]) -> list[Parsed]:
        self.seen.append([index for index, _ in new])
        return [(Message(role="user", content=str(raw["content"])),) for _, raw in new]


def history(turns: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"message {i}"} for i in range(turns)]


def test_only_messages_not_seen_before_are_parsed_and_results_keep_order() -> None:
    known, parse = KnownMessages(max_bytes=1 << 20), CountingParser()
    first = known.parse("openai.chat", history(3), parse)
    again = known.parse("openai.chat", history(5), parse)
    assert parse.seen == [[0, 1, 2], [3, 4]]
    assert [p[0].content for p in again] == [f"message {i}" for i in range(5)]
    assert again[:3] == first
    # Another API's messages with the same bytes are parsed by that API's rules.
    known.parse("anthropic.messages", history(1), parse)
    assert parse.seen[-1] == [0]


def test_bounded_by_key_bytes_a_message_unused_for_two_generations_is_parsed_again() -> None:
    one_key = len(b'{"role":"user","content":"message 0"}')
    known, parse = KnownMessages(max_bytes=4 * one_key), CountingParser()  # 2 keys a generation
    known.parse("api", history(2), parse)  # messages 0 and 1: the young generation is full
    known.parse("api", history(3)[2:], parse)  # message 2 starts a new one; 0 and 1 are old
    known.parse("api", history(1), parse)  # message 0 is found in the old one, moves back
    known.parse("api", history(4)[3:], parse)  # message 3: the old (message 1) is dropped
    assert known.size <= known.max_bytes
    parse.seen.clear()
    known.parse("api", history(4), parse)
    assert parse.seen == [[1]]


def test_a_failing_message_is_not_kept_and_names_its_field() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {"role": "wizard", "content": "x"},
    ]
    for _ in range(2):  # the same answer when the history comes again
        with pytest.raises(InvalidRequest) as error:
            openai_chat.parse_request({"model": "m", "messages": messages}, S)
        assert error.value.param == "messages.1.role"
    messages[1]["role"] = "assistant"
    turn, _ = openai_chat.parse_request({"model": "m", "messages": messages}, S)
    assert [m.role for m in turn.messages] == ["user", "assistant"]


def test_a_message_that_is_not_an_object_is_refused_by_position() -> None:
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}, "hi"]}
    for parse in (openai_chat.parse_request, anthropic_messages.parse_request):
        with pytest.raises(InvalidRequest) as error:
            parse(body, S)
        assert error.value.param == "messages.1"


def test_values_equal_under_python_but_not_in_json_stay_apart() -> None:
    # {"n": 1} == {"n": 1.0} == {"n": True} in Python, but the template renders the arguments
    # as the JSON the client sent: each must keep its own parse.
    def arguments(value: object) -> str:
        body = {
            "model": "m",
            "max_tokens": 8,
            "messages": [
                {"role": "user", "content": "count"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": "t1", "name": "f", "input": {"n": value}}
                    ],
                },
            ],
        }
        turn, _ = anthropic_messages.parse_request(body, S)
        return turn.messages[1].tool_calls[0].arguments

    assert [arguments(v) for v in (1, 1.0, True, 1)] == [
        '{"n": 1}',
        '{"n": 1.0}',
        '{"n": true}',
        '{"n": 1}',
    ]


def test_a_message_beyond_json_bytes_is_parsed_every_time() -> None:
    known, parse = KnownMessages(max_bytes=1 << 20), CountingParser()
    huge = {"role": "user", "content": 1 << 70}  # orjson refuses integers over 64 bits
    for _ in range(2):
        assert known.parse("api", [huge], parse)[0][0].content == str(1 << 70)
    assert parse.seen == [[0], [0]]
    assert known.size == 0


def test_kept_keys_take_about_their_length_in_memory() -> None:
    # orjson's output keeps its 4 KiB write buffer whatever its length: kept as they come, keys
    # would take ten times the bytes the bound counts.
    shared: Parsed = (Message(role="user", content="x"),)
    known = KnownMessages(max_bytes=1 << 30)
    messages = [{"role": "user", "content": f"message {i} " + "x" * 300} for i in range(2000)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        known.parse("api", messages, lambda new: [shared] * len(new))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert known.size > 2000 * 300
    assert held < 1.5 * known.size


def _chat_turn(messages: list[dict[str, Any]], raw: bytes | None = None) -> Any:
    from ingress.wire.json_body import parse_json

    body = {"model": "m", "messages": messages}
    if raw is not None:
        body = parse_json(raw, 64)
    return openai_chat.parse_request(body, S)[0]


def test_a_turn_is_text_only_only_where_its_wire_bytes_name_no_image() -> None:
    """What tells the image pass it may skip a turn (ingress/turns/image_urls.py) errs one way only:
    a turn called text only holds no image; one that may hold one is looked at."""
    from tests.support.image_samples import png

    text = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    assert _chat_turn(text).text_only
    url = "data:image/png;base64," + base64.b64encode(png(8, 8, 1)).decode()
    part = {"type": "image_url", "image_url": {"url": url}}
    with_image = _chat_turn([*text, {"role": "user", "content": [part]}])
    assert not with_image.text_only and with_image.messages[-1].images
    # The part's type written with escapes decodes to the same: orjson writes it plainly.
    escaped = json.dumps({"model": "m", "messages": [*text, {"role": "user", "content": [part]}]})
    escaped = escaped.replace('"image_url"', '"\\u0069mage_url"', 1)
    assert "\\u0069mage_url" in escaped
    turn = _chat_turn([], escaped.encode())
    assert not turn.text_only and turn.messages[-1].images
    # Only a hint: the word in a text part, or a key orjson cannot write, is looked at.
    assert not _chat_turn([{"role": "user", "content": "an image of it"}]).text_only
    known = KnownMessages(max_bytes=1 << 20)
    big = {"role": "user", "content": "x", "extra": 1 << 70}  # a body the stdlib parsed
    assert known.parse_turn("api", history(2), CountingParser()).text_only
    assert not known.parse_turn("api", [*history(2), big], CountingParser()).text_only


def test_an_anthropic_turn_with_an_image_block_is_not_text_only() -> None:
    from tests.support.image_samples import png

    data = base64.b64encode(png(8, 8, 2)).decode()
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}
    body: dict[str, Any] = {"model": "m", "max_tokens": 8, "system": "be brief"}
    text = anthropic_messages.parse_request(
        {**body, "messages": [{"role": "user", "content": "hi"}]}, S
    )[0]
    assert text.text_only and text.messages[0].role == "system"
    turn = anthropic_messages.parse_request(
        {**body, "messages": [{"role": "user", "content": [image]}]}, S
    )[0]
    assert not turn.text_only and turn.messages[-1].images
