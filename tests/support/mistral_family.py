"""The Mistral families' shared conversations and proofs (tests/titoflow/tito/: test_family_mistral,
test_family_mistral_v11, test_family_magistral, test_tokenizer_parity): the conversations every
Mistral tokenizer is held to mistral-common's encoding on, the request mistral-common encodes for
them, the template mistral-common generates, the checks every Mistral format's parser and
template pass, and the corpus proof on a checkpoint template.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
from mistral_common.integrations.chat_templates.chat_templates import generate_chat_template
from mistral_common.protocol.instruct.request import ChatCompletionRequest
from mistral_common.protocol.instruct.validator import ValidationMode
from mistral_common.tokens.tokenizers.base import TokenizerVersion
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

from cli.dev.tokenizers import tokenizer_dir
from tests.support.corpus import Conversation, corpus
from tests.support.family_corpus import generated_text, output_ids
from tests.support.family_corpus import parse as parse_corpus
from tests.support.family_corpus import turns as corpus_turns
from titoflow.errors import TemplateError
from titoflow.tito.families.base import Family, ParserOptions
from titoflow.tito.families.mistral import TOOL_CALLS
from titoflow.tito.messages import Message, ToolCall
from titoflow.tito.output import OutputDelta, ParsedOutput, ReasoningDelta, TextDelta
from titoflow.tito.render import ChatRenderer
from titoflow.tito.tokenizer import load_tokenizer


def tool(name: str, properties: dict[str, Any], description: str = "") -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": list(properties)}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


# As mistral-common dumps its Tool model: the same keys in the same order, so both sides write
# the same [AVAILABLE_TOOLS] JSON.
TOOLS = [
    tool("read_file", {"path": {"type": "string"}}, "Read a file — ünïcode."),
    tool("run", {"command": {"type": "string"}, "timeout": {"type": "integer"}}),
    tool("list_dir", {}),
]


def call(id_: str, name: str, **arguments: Any) -> ToolCall:
    return ToolCall(id=id_, name=name, arguments=json.dumps(arguments, ensure_ascii=False))


SYSTEM = Message(role="system", content="You are a careful agent.")
USER = Message(role="user", content="Fix the test in  src/app.py\n")
CALLS = Message(
    role="assistant",
    content="",
    tool_calls=(
        call("a1B2c3D4e", "read_file", path="src/app.py"),
        call(
            "Zz9Yy8Xx7",
            "run",
            command="echo 'naïve 漢字 🙂' \"q\"\nls",
            timeout=0,
            nested={"deep": [True, None, 2.5, "ü"]},
        ),
        call("000000000", "list_dir"),
    ),
)
RESULTS = (
    Message(role="tool", content="import x\n", tool_call_id="a1B2c3D4e"),
    Message(role="tool", content="Error: exit status 1", tool_call_id="Zz9Yy8Xx7"),
    Message(role="tool", content='{"ok": true, "items": [1, 2]}', tool_call_id="000000000"),
)
SAY_AND_CALL = Message(
    role="assistant", content="Let me check.", tool_calls=(call("q1w2e3r4t", "run", command="x"),)
)
ANSWER = Message(role="assistant", content="Done: the test passes.")
AGAIN = Message(role="user", content="Go on 🙂")

CONVERSATIONS: dict[str, list[Message]] = {
    "chat": [USER, ANSWER, AGAIN],
    "tools": [SYSTEM, USER, CALLS, *RESULTS],
    "tools-answer": [SYSTEM, USER, CALLS, *RESULTS, ANSWER],
    "tools-user-again": [
        SYSTEM,
        USER,
        CALLS,
        *RESULTS,
        ANSWER,
        AGAIN,
        SAY_AND_CALL,
        Message(role="tool", content="", tool_call_id="q1w2e3r4t"),
    ],
    # The template takes a system message only after a user or system one.
    "system-changes": [
        SYSTEM,
        USER,
        Message(role="system", content="Reminder: be brief."),
        ANSWER,
        AGAIN,
    ],
}


def reference_request(messages: list[Message], tools: list[dict[str, Any]]) -> Any:
    """The request mistral-common encodes for ``messages``: an assistant turn's reasoning as a
    thinking chunk before its text (v13's; an encoder without one refuses it)."""
    wire = []
    for message in messages:
        entry = message.template_dict()
        for item in entry.get("tool_calls", ()):
            item["function"]["arguments"] = json.dumps(
                item["function"]["arguments"], ensure_ascii=False
            )
        if (reasoning := entry.pop("reasoning_content", None)) is not None:
            text = [{"type": "text", "text": entry["content"]}] if entry["content"] else []
            entry["content"] = [{"type": "thinking", "thinking": reasoning}, *text]
        wire.append(entry)
    return ChatCompletionRequest(messages=wire, tools=tools or None)


def generated_template(version: str, plain_thinking: bool = False) -> str:
    """The template mistral-common generates for a text-only tekken tokenizer of ``version``
    (``plain_thinking``: writing reasoning as ``<think>`` text, Magistral Small 2506's)."""
    return generate_chat_template(
        spm=False,
        tokenizer_version=TokenizerVersion(version),
        image_support=False,
        audio_support=False,
        thinking_support=False,
        default_system_prompt=None,
        plain_thinking_support=plain_thinking,
        use_special_token_variables=True,
        model_settings_fields=None,
        reasoning_effort_values=None,
        reasoning_effort_default=None,
    )


def mistral_common_tokenizers(data: dict[str, Any], directory: Path) -> dict[ValidationMode, Any]:
    """mistral-common's ``MistralTokenizer`` over the tekken file ``data`` (written into
    ``directory``): its serving (``test``) and fine-tuning modes."""
    path = directory / "tekken.json"
    path.write_text(json.dumps(data, ensure_ascii=False))
    return {
        mode: MistralTokenizer.from_file(str(path), mode=mode)
        for mode in (ValidationMode.test, ValidationMode.finetuning)
    }


def assert_text_encodes_as_mistral_common(tokenizer: Any, reference: Any, text: str) -> None:
    ours = tokenizer.encode(text, add_special_tokens=False)
    theirs = reference[ValidationMode.test].instruct_tokenizer.tokenizer.encode(
        text, bos=False, eos=False
    )
    assert ours == theirs
    assert tokenizer.decode(ours) == text


def assert_encodes_as_mistral_common(
    tokenizer: Any, reference: Any, messages: list[Message], tools: list[dict[str, Any]]
) -> None:
    """Rendered and encoded by titoflow, the ids mistral-common gives the same request: a
    finished conversation (ending with the assistant's answer) in its fine-tuning mode, a prompt
    in its serving one."""
    finished = messages[-1].role == "assistant"
    ours = ChatRenderer(tokenizer).full_prompt(
        messages, tools, {}, add_generation_prompt=not finished
    )
    mode = ValidationMode.finetuning if finished else ValidationMode.test
    theirs = reference[mode].encode_chat_completion(reference_request(messages, tools)).tokens
    assert ours == theirs, tokenizer.decode(ours, skip_special_tokens=False)


def parse_output(
    family: Family, text: str, **options: Any
) -> tuple[list[OutputDelta], ParsedOutput]:
    """``text`` through ``family``'s parser in one piece: the deltas and the summary."""
    parser = family.parser(ParserOptions("step-1", **options))
    deltas = parser.feed(text)
    last, summary = parser.finish()
    return deltas + last, summary


def assert_malformed_call_comes_back(family: Family, calls: str, why: str) -> None:
    """A malformed call run after content: all of it text as generated, ``why`` the error."""
    text = "Hi " + TOOL_CALLS + calls
    _, out = parse_output(family, text)
    assert out.tool_calls == [] and out.content == text
    assert out.parse_error is not None and why in out.parse_error


def assert_streaming_equals_whole(family: Family, text: str) -> None:
    """On every split of ``text``, with tools and without: the summary of the whole parse, and
    deltas that add up to its content and reasoning."""
    for tools in (True, False):
        _, whole = parse_output(family, text, parse_tools=tools)
        for cut in range(len(text) + 1):
            parser = family.parser(ParserOptions("step-1", parse_tools=tools))
            deltas = parser.feed(text[:cut]) + parser.feed(text[cut:])
            last, summary = parser.finish()
            assert summary == whole, (tools, cut)
            shown = deltas + last
            assert "".join(d.text for d in shown if isinstance(d, TextDelta)) == summary.content
            reasoning = "".join(d.text for d in shown if isinstance(d, ReasoningDelta))
            assert reasoning == (summary.reasoning or "")


def assert_turn_parses_back(tokenizer: Any, assistant: Message) -> None:
    """``assistant`` as the template renders it after a user turn parses back to it (the
    family's parser on the text the model would write) and renders to the same tokens."""
    renderer = ChatRenderer(tokenizer)
    history = [SYSTEM, USER]
    prompt = renderer.full_prompt(history, TOOLS, {})
    full = renderer.full_prompt([*history, assistant], TOOLS, {}, add_generation_prompt=False)
    output = full[len(prompt) :]
    assert output[-1] == renderer.terminator_id
    text = tokenizer.decode(output[:-1], skip_special_tokens=False)
    _, out = parse_output(renderer.family, text, tools=TOOLS)
    again = Message(
        role="assistant",
        content=out.content,
        reasoning=out.reasoning,
        tool_calls=tuple(out.tool_calls),
    )
    assert again == assistant
    assert renderer.full_prompt([*history, again], TOOLS, {}, add_generation_prompt=False) == full


def assert_ids_of_another_shape_refused(tokenizer: Any) -> None:
    """Why the parser never hands out ``call_…`` ids: the client echoes them into history, and
    the template refuses any id but nine letters or digits."""
    other = Message(role="assistant", content="", tool_calls=(call("call_0", "list_dir"),))
    with pytest.raises(TemplateError, match="9 characters"):
        ChatRenderer(tokenizer).full_prompt([USER, other], TOOLS, {}, add_generation_prompt=False)


@functools.cache  # loading the tokenizer takes seconds; the renderer is not changed by use
def checkpoint_renderer(family: Family, template: str) -> ChatRenderer:
    """``family`` rendering with a checkpoint's own ``template`` on the family's tokenizer."""
    tokenizer = load_tokenizer(tokenizer_dir(family.name))
    tokenizer.chat_template = template
    return ChatRenderer(tokenizer, family)


# The checkpoints' templates refuse a system message after the first.
CHECKPOINT_CORPUS = [c for c in corpus() if not c.name.startswith("system-change")]


def sampled_call_turn(renderer: ChatRenderer, written: str) -> str:
    """The model's ``SAY_AND_CALL`` turn sampled as ``written`` (as the model and
    mistral-common write it), under a checkpoint template that writes the turn otherwise: it
    parses back to that turn, the chain plus the continuation after its result is not the full
    render, and the continuation is the full render's tail. Returns the turn as the template
    writes it."""
    history = [SYSTEM, USER]
    sampled = [*renderer.encode(written), renderer.terminator_id]
    text = renderer.tokenizer.decode(sampled[:-1], skip_special_tokens=False)
    _, out = parse_output(renderer.family, text)
    assert out.parse_error is None and out.content == SAY_AND_CALL.content
    messages = [*history, SAY_AND_CALL, Message(role="tool", content="r", tool_call_id="q1w2e3r4t")]
    prompt = renderer.full_prompt(history, TOOLS, {})
    continuation = renderer.continuation(messages, 3, True, TOOLS, {})
    full = renderer.full_prompt(messages, TOOLS, {})
    assert prompt + sampled + continuation != full and full[-len(continuation) :] == continuation
    assert full[: len(prompt)] == prompt
    return str(renderer.tokenizer.decode(full[len(prompt) : -len(continuation)]))


def prove_on_corpus(renderer: ChatRenderer, conversation: Conversation) -> None:
    """The family's corpus proof (tests/titoflow/tito/test_family_corpus.py) on a checkpoint
    template:
    each TITO prompt is the full render (or, where the template moved something, the full render
    itself); what it renders as the model's turn parses back to that turn and renders to the
    same tokens."""
    tools = conversation.tools
    checked = 0
    for turn in corpus_turns(renderer, conversation):
        assert turn.prompt == renderer.full_prompt(turn.history, tools, {})
        text = generated_text(renderer, turn.output)
        parsed = parse_corpus(renderer.family, text, tools, False)
        assert parsed.parse_error is None, text
        assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [
            (c.name, json.loads(c.arguments)) for c in turn.answer.tool_calls
        ], text
        assert parsed.content == turn.answer.content.strip(), text
        again = Message(role="assistant", content=parsed.content, tool_calls=parsed.tool_calls)
        ids = tuple(
            c.model_copy(update={"id": a.id})
            for c, a in zip(again.tool_calls, turn.answer.tool_calls, strict=True)
        )
        again = again.model_copy(update={"tool_calls": ids})
        assert output_ids(renderer, turn.history, again, tools, {}) == turn.output, text
        checked += 1
    assert checked == sum(m.role == "assistant" for m in conversation.messages)
