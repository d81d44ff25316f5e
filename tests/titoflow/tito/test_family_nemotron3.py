"""Nemotron 3 (``nemotron3``): the vendored template (llama.cpp's copy of Nemotron 3 Nano's, CRLF
line ends kept) is detected as this family and not as Qwen3-Coder, whose detector also matches
it; the generation prompt opens the reasoning unless ``enable_thinking`` is off; history drops
earlier turns' reasoning; a call opened before ``</think>`` is a call (Qwen3-Coder's parser would
keep it as reasoning); and the forced-call grammar as xgrammar compiles it on the family's
vocabulary."""

from __future__ import annotations

from cli.dev.tokenizers import template_path
from cli.dev.tokenizers.nemotron3 import END, MARKERS, START, TEMPLATE
from tests.support.corpus import corpus
from tests.support.family_checks import (
    LIST_DIR_WITH_PARAMETERS,
    USER,
    FamilyUnderTest,
    read_calls,
    run_tool,
)
from tests.support.family_checks import tool_call as call
from titoflow.tito.families.nemotron3 import NEMOTRON3
from titoflow.tito.families.qwen3 import QWEN3_CODER, QWEN35
from titoflow.tito.messages import Message

# llama.cpp models/templates/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja (zommiommy/llama.cpp
# @a2c9fce), byte for byte: the SHA-256 the Raudbjorn/ggml-llama.cpp mirror's LFS pointer names.
TEMPLATE_SHA256 = "650b9d301337fd103f9014f6f6ae89b46660ae92e4421d95bd3157115e5b02ce"
TOOLS = [run_tool(), LIST_DIR_WITH_PARAMETERS]
OPENING = START + "assistant\n"
UNDER_TEST = FamilyUnderTest("nemotron3", NEMOTRON3, TOOLS, reasoning_open=True)
tokenizer, render, parse = UNDER_TEST.tokenizer, UNDER_TEST.render, UNDER_TEST.parse


def written(turn: Message) -> str:
    """What the template writes of ``turn`` after the user's message, up to its end token."""
    full = render([USER, turn])
    return full[full.rindex(OPENING) + len(OPENING) : full.rindex(END)]


def test_the_template_is_the_vendored_file_and_detected_before_qwen3_coder() -> None:
    assert b"\r\n" in template_path(TEMPLATE).read_bytes()
    # The directory carries it with \n line ends.
    text = UNDER_TEST.vendored_template(TEMPLATE, TEMPLATE_SHA256)
    # Without its own entry it would be served as Qwen3-Coder (Qwen3.5 needs vision markers).
    assert QWEN3_CODER.detect(text) and not QWEN35.detect(text)
    assert not NEMOTRON3.detect(template_path("qwen3_coder.jinja").read_text())
    assert not NEMOTRON3.detect(template_path("qwen35.jinja").read_text())


def test_the_files_crlf_line_ends_render_as_the_directorys() -> None:
    """The directory carries the template with \\n line ends; Jinja renders both the same."""
    crlf = template_path(TEMPLATE).read_bytes().decode()
    checked = 0
    for conversation in corpus():
        messages = [m.template_dict() for m in conversation.messages]
        tools = list(conversation.tools) or None
        for end in range(1, len(messages) + 1):
            rendered = [
                tokenizer().apply_chat_template(
                    messages[:end], tools=tools, tokenize=False, chat_template=template
                )
                for template in (crlf, tokenizer().chat_template)
            ]
            assert rendered[0] == rendered[1], (conversation.name, end)
            checked += 1
    assert checked > 100


def test_markers_are_single_tokens_and_the_directory_says_stand_in() -> None:
    UNDER_TEST.assert_single_tokens((START, END, *MARKERS))
    UNDER_TEST.assert_kept_by_a_skipping_decode("<think>r</think><tool_call>x</tool_call>", END)
    assert "tekken vocabulary" in (UNDER_TEST.stand_in() or "")


def test_enable_thinking_switches_the_opened_reasoning() -> None:
    opened = render([USER], add_generation_prompt=True)
    assert opened.endswith(OPENING + "<think>\n") and NEMOTRON3.reasoning_open(opened[-40:])
    closed = render([USER], add_generation_prompt=True, enable_thinking=False)
    assert closed.endswith(OPENING + "<think></think>")
    assert not NEMOTRON3.reasoning_open(closed[-40:])


def test_history_drops_earlier_reasoning_unless_told_to_keep_it() -> None:
    first = Message(role="assistant", content="Hi.", reasoning="Greet.")
    messages = [USER, first, Message(role="user", content="and then?")]
    # The reasoning's text up to </think> dropped, the newline after it kept.
    assert "<think></think>\nHi.<|im_end|>" in render(messages)
    kept = render(messages, truncate_history_thinking=False)
    assert "<think>\nGreet.\n</think>\nHi.<|im_end|>" in kept
    assert written(first) == "<think>\nGreet.\n</think>\nHi."


def test_the_parser_reads_what_the_template_writes() -> None:
    turn = Message(
        role="assistant",
        content="Listing.",
        reasoning="Look first.",
        tool_calls=(call({"command": "ls\n-la", "timeout": 5}), call({}, "list_dir", 1)),
    )
    text = written(turn).removeprefix("<think>\n")  # the prompt opened it
    parsed = parse(text)
    assert parsed.parse_error is None
    assert (parsed.reasoning, parsed.content) == ("Look first.", "Listing.")
    assert read_calls(parsed) == [("run", {"command": "ls\n-la", "timeout": 5}), ("list_dir", {})]


def test_a_call_opened_in_the_reasoning_ends_it() -> None:
    """As vLLM's ``nemotron_v3`` reasoning parser (Qwen3's) reads it: the call is a call.
    Qwen3-Coder's parser, which served this template before the family, keeps it as
    reasoning."""
    block = written(Message(role="assistant", tool_calls=(call({"command": "ls"}),)))
    text = "Let me look.\n" + block.removeprefix("<think></think>")
    parsed = parse(text)
    assert [c.name for c in parsed.tool_calls] == ["run"] and parsed.parse_error is None
    assert (parsed.reasoning or "").strip() == "Let me look."
    as_coder = parse(text, family=QWEN3_CODER)
    assert as_coder.tool_calls == [] and "<tool_call>" in (as_coder.reasoning or "")


def test_xgrammar_admits_what_the_template_writes_and_no_spelled_tag() -> None:
    """The template's rendering of one call or two is admitted, then <|im_end|> ends the turn;
    a call to an undeclared tool or off its schema is not."""
    one = Message(role="assistant", tool_calls=(call({"command": "ls", "timeout": 5}),))
    two = Message(role="assistant", tool_calls=(call({"command": "a b"}), call({}, "list_dir", 1)))
    written_one = written(one).removeprefix("<think></think>").strip()
    assert written_one.startswith("<tool_call>\n<function=run>")
    UNDER_TEST.assert_xgrammar_admits_the_template(
        END,
        written_one,
        written(two).removeprefix("<think></think>").strip(),
        written_one.replace("=run>", "=rm>"),
        written_one.replace("\n5\n", "\nfive\n"),
    )
