"""Qwen3-Coder: its tokenizer directory (Qwen3's vocabulary, the official Qwen3-Coder template) is
detected as ``qwen3_coder``, and the XML parser reads back every call the template writes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cli.dev.model_build import tokenizer_source_dir
from cli.dev.tokenizers import tokenizer_dir
from tests.support.families import family_tokenizer, function_tool
from titoflow.tito.families import detect_family
from titoflow.tito.families.base import ParserOptions
from titoflow.tito.families.qwen3 import QWEN3_CODER
from titoflow.tito.messages import Message, ToolCall
from titoflow.tito.render import ChatRenderer


def tool(name: str, properties: dict[str, Any]) -> dict[str, Any]:
    return function_tool(name, properties, f"The {name} tool.")


TOOLS = [
    tool(
        "edit",
        {
            "path": {"type": "string"},
            "line": {"type": "integer"},
            "scale": {"type": "number"},
            "changes": {"type": "array"},
            "options": {"type": "object"},
            "note": {"type": ["string", "null"]},
        },
    ),
    tool("flags", {"force": {"type": "boolean"}, "limit": {"type": ["integer", "null"]}}),
    tool("list_dir", {}),
]


def test_detection_picks_qwen3_coder() -> None:
    renderer = ChatRenderer(family_tokenizer("qwen3_coder"))
    assert renderer.family is QWEN3_CODER
    assert detect_family(renderer.tokenizer.chat_template) is QWEN3_CODER
    assert renderer.terminator == "<|im_end|>"


def test_vocabulary_is_qwen3s() -> None:
    built = tokenizer_dir("qwen3_coder")
    for name in ("tokenizer.json", "vocab.json", "merges.txt"):
        assert (built / name).read_bytes() == (tokenizer_source_dir() / name).read_bytes()


def round_trip(arguments: dict[str, Any], name: str = "edit", content: str = "") -> None:
    """The template renders a call as the model would write it; the parser gives it back."""
    renderer = ChatRenderer(family_tokenizer("qwen3_coder"))
    call = ToolCall(id="c0", name=name, arguments=json.dumps(arguments, ensure_ascii=False))
    history = [Message(role="user", content="go")]
    answer = Message(role="assistant", content=content, tool_calls=(call,))
    prompt = renderer.render_text(history, TOOLS, {}, add_generation_prompt=True)
    full = renderer.render_text([*history, answer], TOOLS, {}, add_generation_prompt=False)
    assert full.startswith(prompt)
    text = full[len(prompt) : full.rindex(renderer.terminator)]
    parser = QWEN3_CODER.parser(ParserOptions("step", tools=TOOLS))
    parser.feed(text)
    parsed = parser.finish()[1]
    assert parsed.parse_error is None, text
    assert parsed.content == content
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [(name, arguments)]


@pytest.mark.parametrize(
    "arguments",
    [
        {"path": "a/b.py", "line": 3, "scale": 2.5},
        {"path": "multi\nline\n  text", "note": 'naïve 漢字 🙂 <tag> & "q"'},
        {"changes": [{"line": 3, "text": 'x = {"k": [1, null]}'}, {"line": 9}]},
        {"options": {"dry_run": False, "nested": {"deep": [True, None, "ü"]}}},
        {"path": "  spaced  ", "line": -7, "scale": 0},
    ],
)
def test_xml_calls_read_back(arguments: dict[str, Any]) -> None:
    round_trip(arguments)


def test_content_before_a_call_reads_back() -> None:
    round_trip({"path": "a"}, content="Let me look.")


def test_a_call_without_arguments_reads_back() -> None:
    round_trip({}, name="list_dir")


@pytest.mark.parametrize("arguments", [{"force": True}, {"force": False}, {"limit": None}])
def test_python_literals_read_back(arguments: dict[str, Any]) -> None:
    """The template writes a top-level boolean or null as Python's True/False/None."""
    round_trip(arguments, name="flags")
