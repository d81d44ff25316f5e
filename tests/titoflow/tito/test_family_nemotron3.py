"""Nemotron 3 (``nemotron3``): the vendored template (llama.cpp's copy of Nemotron 3 Nano's, CRLF
line ends kept) is detected as this family and not as Qwen3-Coder, whose detector also matches
it; the generation prompt opens the reasoning unless ``enable_thinking`` is off; history drops
earlier turns' reasoning; a call opened before ``</think>`` is a call (Qwen3-Coder's parser would
keep it as reasoning); and the forced-call grammar as xgrammar compiles it on the family's
vocabulary."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from cli.dev.tokenizers import STAMP, template_path, tokenizer_dir
from cli.dev.tokenizers.nemotron3 import END, MARKERS, START, TEMPLATE
from tests.support.families import family_token_id, family_tokenizer
from tests.titoflow.tito.corpus import corpus
from tests.titoflow.tito.xgrammar_check import admitted, structural_tag
from titoflow.tito.families import detect_family, grammar
from titoflow.tito.families.base import Family, ParserOptions
from titoflow.tito.families.nemotron3 import NEMOTRON3
from titoflow.tito.families.qwen3 import QWEN3_CODER, QWEN35
from titoflow.tito.messages import Message, ToolCall
from titoflow.tito.output import ParsedOutput
from titoflow.tito.tokenizer import TextEncoder

# llama.cpp models/templates/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja (zommiommy/llama.cpp
# @a2c9fce), byte for byte: the SHA-256 the Raudbjorn/ggml-llama.cpp mirror's LFS pointer names.
TEMPLATE_SHA256 = "650b9d301337fd103f9014f6f6ae89b46660ae92e4421d95bd3157115e5b02ce"
RUN = {
    "type": "function",
    "function": {
        "name": "run",
        "description": "Run a command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
            "required": ["command"],
        },
    },
}
LIST_DIR = {
    "type": "function",
    "function": {"name": "list_dir", "description": "List", "parameters": {"properties": {}}},
}
TOOLS = [RUN, LIST_DIR]
USER = Message(role="user", content="go")
OPENING = START + "assistant\n"


def tokenizer() -> Any:
    return family_tokenizer("nemotron3")


token_id = family_token_id("nemotron3")


def render(messages: list[Message], **kwargs: Any) -> str:
    dicts = [m.template_dict() for m in messages]
    return str(tokenizer().apply_chat_template(dicts, tools=TOOLS, tokenize=False, **kwargs))


def call(arguments: dict[str, Any], name: str = "run", index: int = 0) -> ToolCall:
    return ToolCall(id=f"call_{index}", name=name, arguments=json.dumps(arguments))


def parse(text: str, family: Family = NEMOTRON3, reasoning_open: bool = True) -> ParsedOutput:
    parser = family.parser(ParserOptions("step", tools=TOOLS, reasoning_open=reasoning_open))
    parser.feed(text)
    return parser.finish()[1]


def written(turn: Message) -> str:
    """What the template writes of ``turn`` after the user's message, up to its end token."""
    full = render([USER, turn])
    return full[full.rindex(OPENING) + len(OPENING) : full.rindex(END)]


def test_the_template_is_the_vendored_file_and_detected_before_qwen3_coder() -> None:
    raw = template_path(TEMPLATE).read_bytes()
    assert hashlib.sha256(raw).hexdigest() == TEMPLATE_SHA256 and b"\r\n" in raw
    text = template_path(TEMPLATE).read_text()  # the directory carries it with \n line ends
    assert tokenizer().chat_template == text
    assert detect_family(text) is NEMOTRON3
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
    for marker in (START, END, *MARKERS):
        assert token_id(marker) is not None, marker
    assert tokenizer().eos_token == END
    # The reasoning and call markers survive a decode that skips special tokens.
    ids = TextEncoder(tokenizer())("<think>r</think><tool_call>x</tool_call>")
    kept = tokenizer().decode([*ids, token_id(END)], skip_special_tokens=True)
    assert kept == "<think>r</think><tool_call>x</tool_call>"
    stamp = json.loads((tokenizer_dir("nemotron3") / STAMP).read_text())
    assert "tekken vocabulary" in stamp["stand_in"]


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
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [
        ("run", {"command": "ls\n-la", "timeout": 5}),
        ("list_dir", {}),
    ]


def test_a_call_opened_in_the_reasoning_ends_it() -> None:
    """As vLLM's ``nemotron_v3`` reasoning parser (Qwen3's) reads it: the call is a call.
    Qwen3-Coder's parser, which served this template before the family, keeps it as
    reasoning."""
    block = written(Message(role="assistant", tool_calls=(call({"command": "ls"}),)))
    text = "Let me look.\n" + block.removeprefix("<think></think>")
    parsed = parse(text)
    assert [c.name for c in parsed.tool_calls] == ["run"] and parsed.parse_error is None
    assert (parsed.reasoning or "").strip() == "Let me look."
    as_coder = parse(text, QWEN3_CODER)
    assert as_coder.tool_calls == [] and "<tool_call>" in (as_coder.reasoning or "")


def constraint(choice: grammar.ToolChoice, **options: Any) -> str:
    return structural_tag(NEMOTRON3, TOOLS, choice, token_id, **options)


def test_xgrammar_admits_what_the_template_writes_and_no_spelled_tag() -> None:
    """Compiled by xgrammar on the family's vocabulary, as vLLM compiles it: the template's
    rendering of one call or two is admitted, then <|im_end|> ends the turn; a call to an
    undeclared tool or off its schema is not."""
    one = Message(role="assistant", tool_calls=(call({"command": "ls", "timeout": 5}),))
    two = Message(role="assistant", tool_calls=(call({"command": "a b"}), call({}, "list_dir", 1)))
    written_one = written(one).removeprefix("<think></think>").strip()
    assert written_one.startswith("<tool_call>\n<function=run>")
    assert constraint("named").count('"type":"token"') == 2  # both call markers by id
    cases = {
        "named": (constraint("named"), written_one),
        "parallel": (
            constraint("required", parallel=True),
            written(two).removeprefix("<think></think>").strip(),
        ),
        "undeclared_tool": (constraint("required"), written_one.replace("=run>", "=rm>")),
        "text_for_integer": (constraint("named"), written_one.replace("\n5\n", "\nfive\n")),
    }
    result = admitted("nemotron3", END, cases)
    assert result == {
        "named": True,
        "parallel": True,
        "undeclared_tool": False,
        "text_for_integer": False,
    }
