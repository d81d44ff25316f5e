"""DeepSeek-V3.2's template held to DeepSeek's own encoder, the judge: DeepSeek ships no chat
template for V3.2, only ``encoding_dsv32.py``, which vLLM 0.32 runs in its ``deepseek_v32``
tokenizer mode (``vllm/tokenizers/deepseek_v32.py``: the tools as a first system message, chat or
thinking mode, past reasoning dropped when the last message is a user's). The family serves
llama.cpp's port with two pinned edits (cli/dev/tokenizers/deepseek_v32.py).

Every prompt of the family corpus (each prefix ending where a prompt is served: a user message or
tool results) and each whole conversation (history), in chat and in thinking mode, is rendered by
both, the encoder in the engine environment. The texts must be equal once the declared rewrites
are applied, each a named difference with its reason that must still occur; a conversation the
encoder refuses must be one the declared refusal names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from cli.dev.tokenizers import tokenizer_dir
from tests.support.families import family_tokenizer
from tests.titoflow.tito.corpus import corpus, expressible
from tests.titoflow.tito.engine_env import run_in_engine
from titoflow.tito.families import family_named
from titoflow.tito.messages import Message
from titoflow.tito.render import ChatRenderer

ENCODER = """
import json, sys
from vllm.tokenizers.deepseek_v32 import DeepseekV32Tokenizer
request = json.load(sys.stdin)
tok = DeepseekV32Tokenizer.from_pretrained(request["tokenizer"])
out = []
for case in request["cases"]:
    try:
        text = tok.apply_chat_template(
            case["messages"], tools=case["tools"] or None, thinking=case["thinking"], tokenize=False
        )
        out.append(["text", text])
    except ValueError as exc:
        out.append(["refused", str(exc)])
print(json.dumps(out))
"""

BOS = "<｜begin▁of▁sentence｜>"
TOOLS_BLOCK = re.compile(r"## Tools\n.*?</functions>", re.DOTALL)


@dataclass(frozen=True)
class Case:
    name: str
    messages: tuple[Message, ...]
    tools: tuple[Any, ...]
    thinking: bool


def cases() -> list[Case]:
    family = family_named("deepseek_v32")
    found = []
    for conversation in corpus():
        messages = expressible(family, conversation.messages)
        ends = {at + 1 for at, m in enumerate(messages) if m.role != "assistant"}
        for end in sorted(ends | {len(messages)}):
            for thinking in (False, True):
                mode = "thinking" if thinking else "chat"
                found.append(
                    Case(
                        f"{conversation.name}[:{end}]/{mode}",
                        messages[:end],
                        conversation.tools,
                        thinking,
                    )
                )
    return found


def as_vllm_sends(message: Message) -> dict[str, Any]:
    """A message as vLLM's chat parsing hands it to the tokenizer: calls in OpenAI's shape with
    their arguments' JSON text, reasoning under both of vLLM's keys."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.reasoning is not None:
        out["reasoning"] = out["reasoning_content"] = message.reasoning
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


# --- the declared differences --------------------------------------------------------------------


def _tools_as_functions(ours: str, theirs: str, case: Case) -> tuple[str, str]:
    def functions(block: re.Match[str]) -> str:
        head, _, rest = block.group(0).partition("<functions>\n")
        lines = [json.loads(line) for line in rest.removesuffix("</functions>").splitlines()]
        written = [json.dumps(line.get("function", line), ensure_ascii=False) for line in lines]
        return head + "<functions>\n" + "\n".join(written) + "\n</functions>"

    return TOOLS_BLOCK.sub(functions, ours, count=1), theirs


def _tools_prose_single_spaced(ours: str, theirs: str, case: Case) -> tuple[str, str]:
    def single(block: re.Match[str]) -> str:
        prose, marker, schemas = block.group(0).partition("<functions>")
        return prose.replace("\n\n", "\n") + marker + schemas

    return TOOLS_BLOCK.sub(single, ours, count=1), theirs


_SYSTEM_THEN_TOOLS = re.compile(
    re.escape(BOS) + r"(?P<system>.*?)(?:\n\n)?(?P<tools>## Tools\n.*?</functions>)\n", re.DOTALL
)


def _tools_before_system(ours: str, theirs: str, case: Case) -> tuple[str, str]:
    found = _SYSTEM_THEN_TOOLS.match(ours)
    if found is None:
        return ours, theirs
    moved = f"{BOS}\n\n{found['tools']}\n{found['system']}"
    return moved + ours[found.end() :], theirs


def _later_system_dropped(ours: str, theirs: str, case: Case) -> tuple[str, str]:
    for message in case.messages[1:]:
        if message.role == "system" and message.content not in ours:
            theirs = theirs.replace(message.content, "", 1)
    return ours, theirs


@dataclass(frozen=True)
class Rewrite:
    name: str
    reason: str
    apply: Callable[[str, str, Case], tuple[str, str]]


REWRITES = (
    Rewrite(
        "tools_as_openai_objects",
        "the port writes each tool as the request gives it, "
        '{"type": "function", "function": {…}}; the encoder writes the function object only',
        _tools_as_functions,
    ),
    Rewrite(
        "tools_prose_blank_lines",
        "the port's tool instructions put a blank line between paragraphs; vLLM's copy of the "
        "encoder's TOOLS_SYSTEM_TEMPLATE has none",
        _tools_prose_single_spaced,
    ),
    Rewrite(
        "tools_after_system",
        "the port writes the system prompt, a blank line, the tools and a newline; the encoder "
        "puts the tools in a system message of their own before it (vLLM inserts it first): a "
        "blank line, the tools ending in a newline, then the system prompt",
        _tools_before_system,
    ),
    Rewrite(
        "later_system_dropped",
        "the port writes a system message after the first nowhere (no branch of its loop takes "
        "it); the encoder writes its content in place, with no header",
        _later_system_dropped,
    ),
)
# The encoder's one refusal: in thinking mode, an assistant turn after the last user message
# must carry reasoning or calls; the port writes such a turn with an empty reasoning block.
REFUSAL = "ThinkingMode: thinking, invalid message without reasoning/tool_calls"


@pytest.fixture(scope="module")
def compared() -> list[tuple[Case, str, str, str]]:
    """(case, the template's text, the encoder's verdict, the encoder's text or refusal)."""
    renderer = ChatRenderer(family_tokenizer("deepseek_v32"))
    found = cases()
    request = {
        "tokenizer": str(tokenizer_dir("deepseek_v32")),
        "cases": [
            {
                "messages": [as_vllm_sends(m) for m in case.messages],
                "tools": list(case.tools),
                "thinking": case.thinking,
            }
            for case in found
        ],
    }
    verdicts = run_in_engine(ENCODER, request)
    return [
        (
            case,
            renderer.render_text(
                case.messages, case.tools, {"enable_thinking": case.thinking}, True
            ),
            verdict,
            text,
        )
        for case, (verdict, text) in zip(found, verdicts, strict=True)
    ]


def test_the_template_writes_what_deepseeks_encoder_writes(
    compared: list[tuple[Case, str, str, str]],
) -> None:
    occurred = dict.fromkeys([r.name for r in REWRITES], 0)
    equal = refused = 0
    for case, ours, verdict, theirs in compared:
        if verdict == "refused":
            assert theirs.startswith(REFUSAL) and case.thinking, (case.name, theirs)
            assert case.messages[-1].role == "assistant", case.name
            refused += 1
            continue
        equal += ours == theirs
        for rewrite in REWRITES:
            rewritten = rewrite.apply(ours, theirs, case)
            if rewritten != (ours, theirs):
                occurred[rewrite.name] += 1
            ours, theirs = rewritten
        assert ours == theirs, case.name
    print(
        f"\ndeepseek_v32 template vs encoder: {len(compared)} prompts, {equal} equal, "
        f"{len(compared) - equal - refused} equal after rewrites {occurred}, {refused} refused"
    )
    assert not [name for name, count in occurred.items() if not count], occurred
    assert refused > 0, "the declared refusal no longer occurs"
    assert equal > 0
