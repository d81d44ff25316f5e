"""The Mistral families' shared conversations and proofs (tests/titoflow/tito/: test_family_mistral,
test_family_mistral_v11, test_tokenizer_parity): the conversations every Mistral tokenizer is held
to mistral-common's encoding on, the request mistral-common encodes for them, the template
mistral-common generates, and the corpus proof on a checkpoint template.
"""

from __future__ import annotations

import json
from typing import Any

from mistral_common.integrations.chat_templates.chat_templates import generate_chat_template
from mistral_common.protocol.instruct.request import ChatCompletionRequest
from mistral_common.tokens.tokenizers.base import TokenizerVersion

from tests.support.family_corpus import generated_text, output_ids
from tests.support.family_corpus import parse as parse_corpus
from tests.support.family_corpus import turns as corpus_turns
from tests.titoflow.tito.corpus import Conversation
from titoflow.tito.messages import Message, ToolCall
from titoflow.tito.render import ChatRenderer


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
    wire = []
    for message in messages:
        entry = message.template_dict()
        for item in entry.get("tool_calls", ()):
            item["function"]["arguments"] = json.dumps(
                item["function"]["arguments"], ensure_ascii=False
            )
        wire.append(entry)
    return ChatCompletionRequest(messages=wire, tools=tools or None)


def generated_template(version: str) -> str:
    """The template mistral-common generates for a text-only tekken tokenizer of ``version``."""
    return generate_chat_template(
        spm=False,
        tokenizer_version=TokenizerVersion(version),
        image_support=False,
        audio_support=False,
        thinking_support=False,
        default_system_prompt=None,
        plain_thinking_support=False,
        use_special_token_variables=True,
        model_settings_fields=None,
        reasoning_effort_values=None,
        reasoning_effort_default=None,
    )


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
