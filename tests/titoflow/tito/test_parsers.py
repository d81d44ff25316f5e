"""Incremental reasoning/tool-call parsers: streaming equals one-shot, malformed calls stay text."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from typing import Any

import pytest

from tests.support.families import function_tool
from titoflow.tito.families import NAMES, family_named
from titoflow.tito.families.base import ParserOptions, tool_call_id
from titoflow.tito.output import (
    OutputDelta,
    OutputParser,
    ParsedOutput,
    ReasoningDelta,
    TextDelta,
    ToolCallDone,
)


def make_parser(family: str, step_id: str, **options: Any) -> OutputParser:
    return family_named(family).parser(ParserOptions(step_id, **options))


STEP = "step-1"

TOOLS: list[dict[str, Any]] = [
    function_tool(
        "write_file",
        {
            "path": {"type": "string"},
            "content": {"type": "string"},
            "line": {"type": "integer"},
            "ratio": {"type": ["number", "null"]},
            "overwrite": {"type": "boolean"},
            "options": {"type": "object"},
            "tags": {"type": "array"},
        },
    )
]

Case = tuple[str, dict[str, Any], str]


def _json_call(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


CALL_A = _json_call("read", {"path": "a.txt"})
CALL_B = _json_call("grep", {"pattern": "x<y", "paths": ["a", "b"]})
BAD_JSON = '<tool_call>\n{"name": "read", "arguments": {"path": }\n</tool_call>'

XML_CALL = (
    "<tool_call>\n<function=write_file>\n"
    "<parameter=path>\nsrc/a.py\n</parameter>\n"
    "<parameter=content>\ndef f():\n    return 1\n\n</parameter>\n"
    "<parameter=line>\n12\n</parameter>\n"
    "<parameter=overwrite>\ntrue\n</parameter>\n"
    '<parameter=options>\n{"mode": "a", "n": [1, 2]}\n</parameter>\n'
    "</function>\n</tool_call>"
)
XML_CALL_2 = (
    "<tool_call>\n<function=run>\n<parameter=cmd>\nls -la\n</parameter>\n</function>\n</tool_call>"
)
XML_UNCLOSED_PARAM = "<tool_call>\n<function=run>\n<parameter=cmd>\nls\n</function>\n</tool_call>"

QWEN3: dict[str, Any] = {}
CODER: dict[str, Any] = {"tools": TOOLS}

CORPUS: list[Case] = [
    ("qwen3", QWEN3, ""),
    ("qwen3", QWEN3, "Hello, world!"),
    ("qwen3", QWEN3, "  \nIndented start\n\n"),
    ("qwen3", QWEN3, "a < b, <t is not a tag, <tool_cal neither; ends <tool_ca"),
    ("qwen3", QWEN3, "<think>\nLet me think.\n\nTwo steps.\n</think>\n\nThe answer is 4."),
    ("qwen3", QWEN3, "\n <think>x</think>y"),
    ("qwen3", QWEN3, "<think>\n\n</think>\n\nHi"),
    ("qwen3", QWEN3, "<think>a </thin b < </think\n</think>c"),
    ("qwen3", QWEN3, "<think>\nstill thinking\n\n"),
    ("qwen3", QWEN3, "<thi"),
    ("qwen3", QWEN3, "Answer.</think>\n\nmore"),
    ("qwen3", QWEN3, CALL_A),
    ("qwen3", QWEN3, f"{CALL_A}\n{CALL_B}\n"),
    ("qwen3", QWEN3, f"I'll look.\n\n{CALL_A}\n{CALL_B}"),
    ("qwen3", QWEN3, f"<think>\nplan\n</think>\n\n{CALL_A}\n\n{CALL_B}"),
    ("qwen3", QWEN3, f"{CALL_A} between {CALL_B} after"),
    ("qwen3", QWEN3, f"Try:\n{BAD_JSON}\n{CALL_A}"),
    ("qwen3", QWEN3, f"{CALL_A}\n{BAD_JSON}\n{CALL_B}"),
    ("qwen3", QWEN3, 'Sure.\n<tool_call>\n{"name": "read", "arguments": {"path": "a"}}\n'),
    ("qwen3", QWEN3, '<tool_call>\n{"arguments": {}}\n</tool_call>'),
    ("qwen3", QWEN3, '<tool_call>\n{"name": "f", "arguments": "[1]"}\n</tool_call>'),
    ("qwen3", QWEN3, '<tool_call>\n{"name": "ls"}\n</tool_call>'),
    ("qwen3", QWEN3, _json_call("echo", {"text": "héllo ✓ </tool"})),
    ("qwen3", {"parse_tools": False}, f"Text {CALL_A}\n<tool_ca"),
    ("qwen3", {"reasoning_open": True}, "\nplan\n</think>\n\nanswer"),
    ("qwen3", {"reasoning_open": True}, f"plan\n</think>\n\n{CALL_A}"),
    ("qwen3", {"reasoning_open": True}, "only thinking, never closed\n"),
    ("qwen3", QWEN3, f"<think>plan\n{CALL_A}\n{CALL_B}\n</think>\n\nDone."),
    ("qwen3", {"reasoning_open": True}, f"plan{CALL_A[:-12]}\n</think>"),
    ("qwen3_coder", CODER, XML_CALL),
    ("qwen3_coder", CODER, f"<think>\nwrite it\n</think>\n\nWriting.\n{XML_CALL}\n{XML_CALL_2}\n"),
    ("qwen3_coder", CODER, f"{XML_UNCLOSED_PARAM}\n{XML_CALL_2}"),
    ("qwen3_coder", CODER, "<tool_call>\n<function=run>\n</tool_call>"),
    ("qwen3_coder", CODER, f"{XML_CALL_2}\n<tool_call>\n<function=run>\n<parameter=cmd>\nls"),
    ("qwen3_coder", {}, XML_CALL),
    (
        "qwen3_coder",
        CODER,
        "Run:\n<function=run>\n<parameter=cmd>\nls\n</parameter>\n</function>\n",
    ),
    ("qwen3_coder", CODER, "<function=run>\n</function>\n</tool_call> <function=x></funct"),
    ("qwen3_coder", CODER, "<tool_call>\n<function=run>\n<parameter=cmd>\nls\n</parameter>\n"),
    ("qwen3_coder", CODER, f"<tool_call>\n<function=run>\n</function>\n{XML_CALL_2}"),
]


def _merged(deltas: Iterable[OutputDelta]) -> list[OutputDelta]:
    """Adjacent text (or reasoning) deltas joined: what is left once chunking is ignored."""
    out: list[OutputDelta] = []
    for delta in deltas:
        last = out[-1] if out else None
        if isinstance(delta, TextDelta) and isinstance(last, TextDelta):
            out[-1] = TextDelta(last.text + delta.text)
        elif isinstance(delta, ReasoningDelta) and isinstance(last, ReasoningDelta):
            out[-1] = ReasoningDelta(last.text + delta.text)
        else:
            out.append(delta)
    return out


def _run(case: Case, chunks: Iterable[str]) -> tuple[list[OutputDelta], ParsedOutput]:
    family, options, _ = case
    parser = make_parser(family, STEP, **options)
    deltas: list[OutputDelta] = []
    for chunk in chunks:
        deltas += parser.feed(chunk)
    last, summary = parser.finish()
    deltas += last
    assert all(d.text for d in deltas if isinstance(d, TextDelta | ReasoningDelta))
    return deltas, summary


def parse(case: Case) -> tuple[list[OutputDelta], ParsedOutput]:
    """The non-streaming path: the whole text at once."""
    return _run(case, [case[2]])


def _chunkings(text: str, seed: int) -> Iterable[list[str]]:
    yield list(text)  # one character at a time: a split at every boundary
    for cut in range(len(text) + 1):
        yield [text[:cut], text[cut:]]
    rng = random.Random(seed)
    for _ in range(20):
        chunks, at = [], 0
        while at < len(text):
            size = rng.choice([1, 2, 3, 5, 8, 13])
            chunks.append(text[at : at + size])
            at += size
        yield chunks


@pytest.mark.parametrize("case", CORPUS, ids=[f"{i}-{c[0]}" for i, c in enumerate(CORPUS)])
def test_any_chunking_gives_the_one_shot_result(case: Case) -> None:
    whole, summary = parse(case)
    assert summary.content == "".join(d.text for d in whole if isinstance(d, TextDelta))
    reasoning = "".join(d.text for d in whole if isinstance(d, ReasoningDelta))
    assert summary.reasoning in (None, reasoning)
    assert summary.tool_calls == [d.call for d in whole if isinstance(d, ToolCallDone)]
    for chunks in _chunkings(case[2], seed=len(case[2])):
        streamed, streamed_summary = _run(case, chunks)
        assert _merged(streamed) == _merged(whole), chunks
        assert streamed_summary == summary, chunks


def test_text_is_released_as_soon_as_it_cannot_be_a_tag() -> None:
    parser = make_parser("qwen3", STEP)
    assert parser.feed("Hello <t") == [TextDelta("Hello")]
    assert parser.feed("ool") == []
    assert parser.feed("box> ok") == [TextDelta(" <toolbox> ok")]
    assert parser.feed("\n\n") == []  # may be the gap before a tool call
    assert parser.feed("more") == [TextDelta("\n\nmore")]


def test_reasoning_streams_live_without_tags_or_edge_newlines() -> None:
    parser = make_parser("qwen3", STEP)
    assert parser.feed("<think>\nfirst") == [ReasoningDelta("first")]
    assert parser.feed(" line\n") == [ReasoningDelta(" line")]
    assert parser.feed("</th") == []
    assert parser.feed("ink>\n\nDone") == [TextDelta("Done")]
    _, summary = parser.finish()
    assert summary == ParsedOutput(content="Done", reasoning="first line")


def test_text_between_calls_keeps_its_own_spacing() -> None:
    _, out = parse(("qwen3", QWEN3, f"A\n{CALL_A} B\n\n{CALL_B}\n"))
    assert out.content == "A B" and len(out.tool_calls) == 2


def test_plain_text() -> None:
    _, out = parse(("qwen3", QWEN3, "Hello\n"))
    assert out == ParsedOutput(content="Hello")  # trailing whitespace is never content


def test_parallel_calls_with_text_before() -> None:
    deltas, out = parse(("qwen3", QWEN3, f"I'll look.\n\n{CALL_A}\n{CALL_B}\n"))
    assert out.content == "I'll look."
    assert out.reasoning is None and out.parse_error is None
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [
        ("read", {"path": "a.txt"}),
        ("grep", {"pattern": "x<y", "paths": ["a", "b"]}),
    ]
    assert [d.index for d in deltas if isinstance(d, ToolCallDone)] == [0, 1]
    assert [c.id for c in out.tool_calls] == [tool_call_id(STEP, 0), tool_call_id(STEP, 1)]


def test_think_then_calls() -> None:
    _, out = parse(("qwen3", QWEN3, f"<think>\nplan\n</think>\n\n{CALL_A}\n\n{CALL_B}"))
    assert out.reasoning == "plan" and out.content == "" and len(out.tool_calls) == 2


def test_unclosed_think_is_all_reasoning() -> None:
    _, out = parse(("qwen3", QWEN3, "<think>\nstill thinking <tool_ca\n\n"))
    assert out == ParsedOutput(content="", reasoning="still thinking <tool_ca")


def test_call_opened_in_reasoning_ends_it() -> None:
    """Qwen3 opens calls before </think> (as vLLM's qwen3 reasoning parser reads it); the late
    </think> is the reasoning's own closer, dropped, and closes a call left open."""
    _, out = parse(("qwen3", QWEN3, f"<think>\nstill\n{CALL_A}\n\n"))
    assert out.reasoning == "still" and out.content == "" and out.parse_error is None
    assert [c.name for c in out.tool_calls] == ["read"]
    _, out = parse(("qwen3", QWEN3, f"<think>plan\n{CALL_A}\n{CALL_B}\n</think>\n\nDone."))
    assert out.reasoning == "plan" and out.content == "Done." and out.parse_error is None
    assert [c.name for c in out.tool_calls] == ["read", "grep"]
    open_call = CALL_A.removesuffix("</tool_call>")
    _, out = parse(("qwen3", {"reasoning_open": True}, f"plan{open_call}</think>"))
    assert [c.name for c in out.tool_calls] == ["read"] and out.parse_error is None


def test_empty_think_is_empty_reasoning() -> None:
    _, out = parse(("qwen3", QWEN3, "<think>\n\n</think>\n\nHi"))
    assert out == ParsedOutput(content="Hi", reasoning="")


def test_stray_close_think_is_content() -> None:
    _, out = parse(("qwen3", QWEN3, "Answer.</think>\n\nmore"))
    assert out == ParsedOutput(content="Answer.</think>\n\nmore")


def test_reasoning_open_from_the_prompt() -> None:
    _, out = parse(("qwen3", {"reasoning_open": True}, f"\nplan\n</think>\n\nSo: {CALL_A}"))
    assert out.reasoning == "plan" and out.content == "So:" and len(out.tool_calls) == 1
    _, out = parse(("qwen3", {"reasoning_open": True}, "never closed\n"))
    assert out == ParsedOutput(content="", reasoning="never closed")


def test_malformed_json_stays_text_and_is_reported() -> None:
    text = f"{CALL_A}\nTry:\n{BAD_JSON}\n{CALL_B}"
    deltas, out = parse(("qwen3", QWEN3, text))
    # The gap before text is kept, before a call dropped; the bad block is exactly as generated.
    assert out.content == f"\nTry:\n{BAD_JSON}"
    assert [c.name for c in out.tool_calls] == ["read", "grep"]
    assert [d.index for d in deltas if isinstance(d, ToolCallDone)] == [0, 1]
    assert out.parse_error is not None
    assert out.parse_error.startswith("<tool_call> block 1: invalid JSON")


@pytest.mark.parametrize(
    ("inner", "why"),
    [
        ('{"arguments": {}}', "name"),
        ('{"name": 3, "arguments": {}}', "name"),
        ('{"name": "f", "arguments": "[1]"}', "arguments"),
        ("[1, 2]", "not a JSON object"),
    ],
)
def test_call_shape_errors(inner: str, why: str) -> None:
    block = f"<tool_call>\n{inner}\n</tool_call>"
    _, out = parse(("qwen3", QWEN3, block))
    assert out.content == block and out.tool_calls == []
    assert out.parse_error is not None and why in out.parse_error


def test_call_without_arguments_takes_none() -> None:
    _, out = parse(("qwen3", QWEN3, '<tool_call>\n{"name": "ls"}\n</tool_call>'))
    assert out.parse_error is None and out.tool_calls[0].arguments == "{}"


def test_call_the_output_ends_inside_is_closed_there() -> None:
    text = 'Sure.\n<tool_call>\n{"name": "read", "arguments": {"path": "a"}}\n'
    _, out = parse(("qwen3", QWEN3, text))
    assert out.content == "Sure." and [c.name for c in out.tool_calls] == ["read"]
    assert out.parse_error is None


def test_call_cut_off_is_text_exactly_as_generated() -> None:
    text = 'Sure.\n<tool_call>\n{"name": "read", "arguments": {"pa'
    _, out = parse(("qwen3", QWEN3, text))
    assert out.content == text and out.tool_calls == []
    assert out.parse_error is not None
    assert out.parse_error.startswith("<tool_call> block 0: not closed, and invalid JSON")


def test_call_with_parameters_for_arguments_is_refused() -> None:
    block = '<tool_call>\n{"name": "read", "parameters": {"path": "a"}}\n</tool_call>'
    _, out = parse(("qwen3", QWEN3, block))
    assert out.content == block and out.tool_calls == []
    assert out.parse_error is not None and "unexpected keys ['parameters']" in out.parse_error


def test_first_error_wins() -> None:
    _, out = parse(("qwen3", QWEN3, f"{BAD_JSON}\n<tool_call>\n{{}}"))
    assert out.parse_error is not None and "block 0: invalid JSON" in out.parse_error


def test_parse_tools_false_leaves_calls_as_text() -> None:
    _, out = parse(("qwen3", {"parse_tools": False}, f"Text {CALL_A}"))
    assert out == ParsedOutput(content=f"Text {CALL_A}")


def test_non_ascii_arguments_survive() -> None:
    _, out = parse(("qwen3", QWEN3, _json_call("echo", {"text": "héllo ✓"})))
    assert json.loads(out.tool_calls[0].arguments) == {"text": "héllo ✓"}


def test_coder_typed_parameters() -> None:
    _, out = parse(("qwen3_coder", CODER, f"Writing.\n{XML_CALL}\n{XML_CALL_2}\n"))
    assert out.content == "Writing." and out.parse_error is None
    write, run = out.tool_calls
    assert write.name == "write_file" and run.name == "run"
    assert json.loads(write.arguments) == {
        "path": "src/a.py",
        "content": "def f():\n    return 1\n",  # one newline each side is layout; the rest is data
        "line": 12,
        "overwrite": True,
        "options": {"mode": "a", "n": [1, 2]},
    }
    assert json.loads(run.arguments) == {"cmd": "ls -la"}  # unknown tool: strings


def test_coder_unparseable_typed_value_stays_a_string() -> None:
    block = (
        "<tool_call>\n<function=write_file>\n<parameter=line>\nnext\n</parameter>\n"
        "<parameter=ratio>\n0.5\n</parameter>\n<parameter=tags>\n[1,\n</parameter>\n"
        "<parameter=path>\n42\n</parameter>\n</function>\n</tool_call>"
    )
    _, out = parse(("qwen3_coder", CODER, block))
    assert json.loads(out.tool_calls[0].arguments) == {
        "line": "next",
        "ratio": 0.5,
        "tags": "[1,",
        "path": "42",
    }


def test_coder_without_schemas_keeps_strings() -> None:
    _, out = parse(("qwen3_coder", {}, XML_CALL))
    assert json.loads(out.tool_calls[0].arguments)["line"] == "12"


@pytest.mark.parametrize(
    "block",
    [
        XML_UNCLOSED_PARAM,
        '<tool_call>\n{"name": "run"}\n</tool_call>',
        "<tool_call>\n<function=run>\nls\n</function>\n</tool_call>",
        "<tool_call>\n<function=run>\n<parameter=x>\n1\n</parameter>\n"
        "<parameter=x>\n2\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=run\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
    ],
)
def test_coder_malformed_xml_stays_text(block: str) -> None:
    _, out = parse(("qwen3_coder", CODER, f"{block}\n{XML_CALL_2}"))
    assert out.content == block
    assert [c.name for c in out.tool_calls] == ["run"]
    assert out.parse_error is not None and out.parse_error.startswith("<tool_call> block 0:")


@pytest.mark.parametrize(
    ("text", "calls"),
    [
        # No <tool_call> wrapper (and a stray closer after it, as if there had been one).
        ("<function=run>\n<parameter=cmd>\nls\n</parameter>\n</function>", [("run", "ls")]),
        (
            "<function=run>\n<parameter=cmd>\nls\n</parameter>\n</function>\n</tool_call>",
            [("run", "ls")],
        ),
        # </parameter> skipped before the next parameter: that parameter ends the value.
        (
            "<tool_call>\n<function=write_file>\n<parameter=path>\na\n<parameter=line>\n3\n"
            "</parameter>\n</function>\n</tool_call>",
            [("write_file", "a", 3)],
        ),
        # The output ends inside the block, or before its </function>.
        ("<tool_call>\n<function=run>\n<parameter=cmd>\nls\n</parameter>\n", [("run", "ls")]),
        (
            "<tool_call>\n<function=run>\n<parameter=cmd>\nls\n</parameter>\n</tool_call>",
            [("run", "ls")],
        ),
        ("<tool_call>\n<function=run>\n</tool_call>", [("run",)]),
        # </tool_call> skipped before the next <tool_call>: that one closes the block.
        (
            "<tool_call>\n<function=run>\n<parameter=cmd>\nls\n</parameter>\n</function>\n"
            "<tool_call>\n<function=run>\n<parameter=cmd>\npwd\n</parameter>\n</function>\n"
            "</tool_call>",
            [("run", "ls"), ("run", "pwd")],
        ),
        # Two functions in one block.
        (
            "<tool_call>\n<function=run>\n<parameter=cmd>\nls\n</parameter>\n</function>\n"
            "<function=run>\n<parameter=cmd>\npwd\n</parameter>\n</function>\n</tool_call>",
            [("run", "ls"), ("run", "pwd")],
        ),
    ],
)
def test_coder_reads_the_calls_its_models_bend(text: str, calls: list[tuple[Any, ...]]) -> None:
    deltas, out = parse(("qwen3_coder", CODER, "Go.\n" + text))
    assert out.parse_error is None and out.content == "Go."
    found = [(c.name, *json.loads(c.arguments).values()) for c in out.tool_calls]
    assert found == calls
    assert [d.index for d in deltas if isinstance(d, ToolCallDone)] == list(range(len(calls)))


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("<function=run>\n<parameter=cmd>\nls", "not closed, and parameter 'cmd' not closed"),
        ("<tool_call>\n<function=run>\n<parameter=cmd>\nl", "not closed, and parameter"),
        ("<tool_call>\n<function=run>\n<parameter=cmd>\nls\n</parameter>\nmore", "not closed"),
    ],
)
def test_coder_a_block_cut_where_a_value_is_unknown_is_text(text: str, why: str) -> None:
    _, out = parse(("qwen3_coder", CODER, text))
    assert out.tool_calls == [] and out.content == text
    assert out.parse_error is not None and why in out.parse_error


def test_ids_are_deterministic() -> None:
    assert tool_call_id("s", 0) == tool_call_id("s", 0)
    assert len({tool_call_id("s", 0), tool_call_id("s", 1), tool_call_id("t", 0)}) == 3
    assert tool_call_id("s", 0).startswith("call_") and len(tool_call_id("s", 0)) == 29
    assert tool_call_id("s", 0, prefix="toolu_").startswith("toolu_")
    _, out = parse(("qwen3", {"id_prefix": "toolu_"}, CALL_A))
    assert out.tool_calls[0].id == tool_call_id(STEP, 0, "toolu_")
    assert parse(("qwen3", {"id_prefix": "toolu_"}, CALL_A)) == parse(
        ("qwen3", {"id_prefix": "toolu_"}, CALL_A)
    )


def test_unknown_family() -> None:
    with pytest.raises(ValueError, match=", ".join(NAMES)):
        make_parser("nonesuch", STEP)
