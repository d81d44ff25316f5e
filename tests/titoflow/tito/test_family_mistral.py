"""The Mistral family (tekken v7): its tokenizer and template against mistral-common's own
encoding, its parser, its grammar and its TITO continuations.

The proof that the converted tokenizer and the template are right: every conversation below,
rendered with the HF template and encoded with the HF tokenizer, gives exactly the token ids
mistral-common's ``MistralTokenizer`` (v7) gives for the same request.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import re
from dataclasses import replace
from typing import Any

import pytest
from mistral_common.protocol.instruct.validator import ValidationMode
from mistral_common.tokens.tokenizers.base import TokenizerVersion
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

from cli.dev.tokenizers import mistral as recipe
from cli.dev.tokenizers import template_path
from tests.support.corpus import Conversation
from tests.support.families import family_tokenizer
from tests.support.mistral_family import (
    AGAIN,
    ANSWER,
    CALLS,
    CHECKPOINT_CORPUS,
    CONVERSATIONS,
    RESULTS,
    SAY_AND_CALL,
    SYSTEM,
    TOOLS,
    USER,
    assert_encodes_as_mistral_common,
    assert_ids_of_another_shape_refused,
    assert_malformed_call_comes_back,
    assert_streaming_equals_whole,
    assert_text_encodes_as_mistral_common,
    assert_turn_parses_back,
    checkpoint_renderer,
    generated_template,
    mistral_common_tokenizers,
    parse_output,
    prove_on_corpus,
    reference_request,
    sampled_call_turn,
)
from titoflow.errors import NotAppendOnly, TemplateError
from titoflow.tito.families import detect_family
from titoflow.tito.families.base import tool_call_id
from titoflow.tito.families.grammar import tool_call_constraint
from titoflow.tito.families.mistral import MISTRAL, TOOL_CALLS
from titoflow.tito.messages import Message
from titoflow.tito.output import TextDelta, ToolCallDone
from titoflow.tito.render import ChatRenderer


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return family_tokenizer("mistral")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """mistral-common's v7 tokenizer over the same vocabulary (the file declares v3; the v7
    format uses only the control tokens the file's default list already has)."""
    data = json.loads(recipe.tekken_file().read_text())
    data["config"]["version"] = TokenizerVersion.v7.value
    return mistral_common_tokenizers(data, tmp_path_factory.mktemp("tekken"))


def test_template_is_mistral_commons_own() -> None:
    assert template_path(recipe.TEMPLATE).read_text() == generated_template("v7")


@pytest.mark.parametrize(
    "text",
    [
        "Hello world",
        "  leading spaces\n\n\ttabs  \r\n",
        "数字 12345 ünïcödé 🎉 ÀÉÎ ﬁ 𝒳 zero\u200bwidth",
        "def f(x):\n    return x**2  # ok\n",
        '{"a": [1, 2.5, {"b": "c\\n"}], "d": null}',
        "   \n\n\n   x",
    ],
)
def test_plain_text_encodes_as_mistral_common_does(
    tokenizer: Any, reference: Any, text: str
) -> None:
    assert_text_encodes_as_mistral_common(tokenizer, reference, text)


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("with_tools", [True, False], ids=["tools", "no-tools"])
def test_conversations_encode_as_mistral_common_does(
    tokenizer: Any, reference: Any, name: str, with_tools: bool
) -> None:
    tools = TOOLS if with_tools else []
    assert_encodes_as_mistral_common(tokenizer, reference, CONVERSATIONS[name], tools)


def test_detection_and_turn_end(tokenizer: Any) -> None:
    renderer = ChatRenderer(tokenizer)
    assert renderer.family is MISTRAL
    assert renderer.terminator == "</s>" and renderer.stop_token_ids == (2,)
    assert renderer.token_id(TOOL_CALLS) == 9, "[TOOL_CALLS] is one control token"
    assert renderer.assistant_opening() == [], "an assistant turn follows [/INST] directly"


def test_detects_the_json_list_versions_only() -> None:
    assert detect_family(generated_template("v3")) is MISTRAL  # Mistral-Nemo: same call format
    for later in ("v11", "v13"):  # [TOOL_CALLS]NAME[ARGS]{...}: another format
        assert not MISTRAL.detect(generated_template(later))


parse = functools.partial(parse_output, MISTRAL)


def calls_text(*calls: dict[str, Any]) -> str:
    return TOOL_CALLS + json.dumps(list(calls), ensure_ascii=False)


def test_content_then_calls_with_the_ids_the_model_wrote() -> None:
    text = "Let me look." + calls_text(
        {"name": "read_file", "arguments": {"path": "ü"}, "id": "abcDEF123"},
        {"name": "list_dir", "arguments": {}, "id": "999999999"},
    )
    deltas, out = parse(text)
    assert out.content == "Let me look." and out.parse_error is None and out.reasoning is None
    assert [(c.id, c.name, json.loads(c.arguments)) for c in out.tool_calls] == [
        ("abcDEF123", "read_file", {"path": "ü"}),
        ("999999999", "list_dir", {}),
    ]
    assert [type(d) for d in deltas] == [TextDelta, ToolCallDone, ToolCallDone]


def test_a_call_without_id_gets_a_deterministic_nine_character_one() -> None:
    _, out = parse(calls_text({"name": "list_dir", "arguments": {}}, {"name": "run"}))
    first, second = out.tool_calls
    assert first.id == tool_call_id("step-1", 0, prefix="")[:9]
    assert re.fullmatch("[0-9a-f]{9}", second.id) and second.id != first.id
    assert json.loads(second.arguments) == {}
    assert parse(calls_text({"name": "list_dir"}), id_prefix="toolu_")[1].tool_calls[0].id == (
        first.id
    ), "the format fixes the ids: no API prefix"
    assert MISTRAL.native_call_id is not None
    assert re.fullmatch("[0-9a-f]{9}", MISTRAL.native_call_id("run", 3))


def test_the_template_rejects_ids_of_another_shape(tokenizer: Any) -> None:
    assert_ids_of_another_shape_refused(tokenizer)


@pytest.mark.parametrize(
    "calls, why",
    [
        ('[{"name": "run", "arguments": {"command": ', "invalid JSON"),
        ('[{"name": "run", "arguments": {}}] and more', "text after the call list"),
        ("[]", "not a non-empty JSON list"),
        (' "run"', "not a non-empty JSON list"),
        ('[{"name": "run", "arguments": {}, "id": "call_1"}]', '"id" is not 9'),
        ('[{"name": "run", "arguments": "{}"}]', '"arguments" is not an object'),
        ('[{"name": "", "arguments": {}}]', '"name"'),
        ('[{"name": "run", "arguments": {}, "extra": 1}]', "unknown keys"),
        ('[{"name": "run"}][TOOL_CALLS][{"name": "run"}]', "text after the call list"),
    ],
)
def test_malformed_calls_come_back_as_generated(calls: str, why: str) -> None:
    assert_malformed_call_comes_back(MISTRAL, calls, why)


@pytest.mark.parametrize(
    "calls",
    [
        ' [{"name": "run", "arguments": {"x": 1}, "id": "abcdefghi"}]',  # Small 3.1's template
        '\n[{"name": "run", "arguments": {"x": 1}, "id": "abcdefghi"}] \n',
        '{"name": "run", "arguments": {"x": 1}, "id": "abcdefghi"}',  # one call, no list
        ' {"name": "run", "arguments": {"x": 1}, "id": "abcdefghi"}',
    ],
)
def test_whitespace_before_the_calls_and_a_bare_call_object(calls: str) -> None:
    """As vLLM's Mistral parser reads them: the same call."""
    _, out = parse("Hi " + TOOL_CALLS + calls)
    assert out.parse_error is None and out.content == "Hi "
    assert [(c.id, c.name, json.loads(c.arguments)) for c in out.tool_calls] == [
        ("abcdefghi", "run", {"x": 1})
    ]


def test_without_tools_call_syntax_stays_text() -> None:
    text = "x" + calls_text({"name": "run", "arguments": {}, "id": "abcdefghi"})
    _, out = parse(text, parse_tools=False)
    assert out.content == text and out.tool_calls == [] and out.parse_error is None


def test_unread_control_tokens_are_dropped_from_content() -> None:
    _, out = parse("a[INST]b<SPECIAL_42></s>c[/TOOL_RESULTS] [NOTE] <b>")
    assert out.content == "abc [NOTE] <b>"


STREAMED = [
    "Sure, reading." + calls_text({"name": "read_file", "arguments": {"path": "[/INST]"}}),
    "a[INST]b[IN[/SYSTEM_PROMPT]<SPECIAL_7><SPECIAL_1234> [TOOL_CALL [TOOL_CALLS",
    "Hi " + TOOL_CALLS + '[{"name": "run", "arguments": {"x": "[TOOL_CALLS]"}',
    calls_text({"name": "a", "arguments": {"k": [1, {"z": None}]}, "id": "ZZZZZZZZZ"}) + "\n",
]


@pytest.mark.parametrize("text", STREAMED)
def test_streaming_equals_whole_on_every_split(text: str) -> None:
    assert_streaming_equals_whole(MISTRAL, text)


@pytest.mark.parametrize("assistant", [CALLS, SAY_AND_CALL, ANSWER], ids=["calls", "both", "text"])
def test_rendered_turn_parses_back_and_renders_the_same(tokenizer: Any, assistant: Message) -> None:
    assert_turn_parses_back(tokenizer, assistant)


def test_tito_continuations_after_calls_and_results(tokenizer: Any) -> None:
    """Assistant→tool and tool→tool boundaries, and a user turn without tools, are
    append-only: the chain plus the continuation is the full render."""
    renderer = ChatRenderer(tokenizer)
    for messages, tools in [
        ([SYSTEM, USER, CALLS, *RESULTS], TOOLS),
        (
            [
                SYSTEM,
                USER,
                SAY_AND_CALL,
                Message(role="tool", content="r", tool_call_id="q1w2e3r4t"),
            ],
            TOOLS,
        ),
        ([SYSTEM, USER, ANSWER, AGAIN], []),
    ]:
        covered = 3
        chain = renderer.full_prompt(messages[:covered], tools, {}, add_generation_prompt=False)
        continuation = renderer.continuation(messages, covered, True, tools, {})
        assert chain + continuation == renderer.full_prompt(messages, tools, {})


TOOLS_BLOCK = re.compile(r"\[AVAILABLE_TOOLS\].*?\[/AVAILABLE_TOOLS\]", re.DOTALL)


def test_a_new_user_turn_with_tools_is_not_append_only(tokenizer: Any) -> None:
    """The template writes [AVAILABLE_TOOLS] before the last user message only: a new user
    turn moves the block, so no continuation of the chain exists (the ingress renders the
    conversation in full, a new chain: the declared tools_moved divergence)."""
    renderer = ChatRenderer(tokenizer)
    messages = [SYSTEM, USER, ANSWER, AGAIN]
    with pytest.raises(NotAppendOnly):
        renderer.continuation(messages, 3, True, TOOLS, {})
    text = renderer.render_text(messages, TOOLS, {}, add_generation_prompt=True)
    [block] = TOOLS_BLOCK.finditer(text)
    assert text[block.end() :] == "[INST]Go on 🙂[/INST]"
    assert "tools_moved" in MISTRAL.divergences


def test_forced_call_grammar(tokenizer: Any) -> None:
    renderer = ChatRenderer(tokenizer)
    constraint = tool_call_constraint(
        MISTRAL, TOOLS, "named", "run", renderer.token_id, parallel=True
    )
    assert constraint is not None
    tag = json.loads(constraint["structured_outputs"]["structural_tag"])
    opening, bracket, body, closing = tag["format"]["elements"]
    assert opening == {"type": "token", "token": 9}, "[TOOL_CALLS] by its id"
    assert bracket == {"type": "const_string", "value": "["}
    assert closing == {"type": "const_string", "value": "]"}
    first, more = body["elements"]
    name, arguments = first["elements"][0]["elements"]
    assert name == {"type": "const_string", "value": '{"name": "run", "arguments": '}
    assert arguments["json_schema"] == TOOLS[1]["function"]["parameters"]
    assert first["elements"][1:] == [
        {"type": "const_string", "value": ', "id": "'},
        {"type": "regex", "pattern": "[A-Za-z0-9]{9}"},
        {"type": "const_string", "value": '"}'},
    ]
    assert more["content"]["elements"][0] == {"type": "const_string", "value": ", "}
    with pytest.raises(ValueError, match="no reasoning block"):
        tool_call_constraint(MISTRAL, TOOLS, "required", None, renderer.token_id, reasoning=True)


# --- Mistral Small 3.1's own checkpoint template ------------------------------------------------
# templates/mistral_small_3_1.jinja (source in cli/dev/tokenizers/mistral.py): what a user
# serving the checkpoint's tokenizer_config gets. Detected as this family; the model writes the
# same calls (the parser reads its "[TOOL_CALLS] [" too), the history it renders departs from
# mistral-common's in the ways pinned below.

CHECKPOINT = template_path(recipe.CHECKPOINT_TEMPLATE).read_text()
# The template's own paragraphs as it renders them (its "\<newline>" escapes join the lines).
_TOOL_USE = re.search(r'set parallel_tool_prompt = ("[^\n]*?") %}', CHECKPOINT)
assert _TOOL_USE is not None
TOOL_USE = json.loads(_TOOL_USE[1])
DEFAULT_SYSTEM = (
    "You are Mistral Small 3, a Large Language Model (LLM) created by Mistral AI, a French "
    "startup headquartered in Paris.Your knowledge base was last updated on 2023-10-01. The "
    "current date is {today}.When you're not sure about some information, you say that you "
    "don't have the information and don't make up anything.If the user's question is not "
    "clear, ambiguous, or does not provide enough context for you to accurately answer the "
    "question, you do not try to answer it right away and you rather ask the user to clarify "
    'their request (e.g. "What are some good restaurants around me?" => "Where are you?" or '
    '"When is the next flight to Tokyo" => "Where do you travel from?")'
)


# It writes a calling turn's calls alone (Nemo's too): the corpus as it can express it.
CHECKPOINT_FAMILY = replace(MISTRAL, content_with_calls=False)


def test_the_checkpoint_template_is_detected_as_mistral() -> None:
    assert "[TOOL_CALLS] [" in CHECKPOINT and "[TOOL_CALLS][" not in CHECKPOINT
    assert detect_family(CHECKPOINT) is MISTRAL


def as_the_checkpoint_writes(text: str, tools: bool, today: str) -> str:
    """mistral-common's rendering rewritten by every departure of the checkpoint template."""
    # A default system prompt with today's date where the conversation has none.
    if not text.startswith("<s>[SYSTEM_PROMPT]"):
        default = DEFAULT_SYSTEM.format(today=today)
        text = "<s>[SYSTEM_PROMPT]" + default + "[/SYSTEM_PROMPT]" + text.removeprefix("<s>")
    # The tool-use paragraph before the system prompt when there are tools.
    if tools:
        text = text.replace("[SYSTEM_PROMPT]", "[SYSTEM_PROMPT]" + TOOL_USE, 1)
    text = text.replace("[AVAILABLE_TOOLS][", "[AVAILABLE_TOOLS] [")
    # A calling turn: its calls alone, after a space.
    text = re.sub(
        r"(\[/INST\]|\[/TOOL_RESULTS\])[^\[\]]*\[TOOL_CALLS\]\[", r"\1[TOOL_CALLS] [", text
    )
    # v3-style results: the content raw inside a JSON-like object, with the call id.
    return re.sub(
        r"\[TOOL_RESULTS\](\w{9})\[TOOL_CONTENT\](.*?)\[/TOOL_RESULTS\]",
        r'[TOOL_RESULTS] {"content": \2, "call_id": "\1"}[/TOOL_RESULTS]',
        text,
        flags=re.DOTALL,
    )


@pytest.mark.parametrize("name", sorted(set(CONVERSATIONS) - {"system-changes"}))
@pytest.mark.parametrize("with_tools", [True, False], ids=["tools", "no-tools"])
def test_the_checkpoint_template_departs_from_mistral_common_as_declared(
    tokenizer: Any, name: str, with_tools: bool
) -> None:
    """Its rendering is mistral-common's (the template test above proves that one token for
    token) with exactly the departures :func:`as_the_checkpoint_writes` makes."""
    messages, tools = CONVERSATIONS[name], TOOLS if with_tools else []
    finished = messages[-1].role == "assistant"
    ours = ChatRenderer(tokenizer).render_text(messages, tools, {}, not finished)
    theirs = checkpoint_renderer(CHECKPOINT_FAMILY, CHECKPOINT).render_text(
        messages, tools, {}, not finished
    )
    today = dt.date.today().isoformat()
    assert as_the_checkpoint_writes(ours, with_tools, today) == theirs


def test_the_checkpoint_template_refuses_a_later_system_message() -> None:
    with pytest.raises(TemplateError, match="Only user and assistant roles"):
        checkpoint_renderer(CHECKPOINT_FAMILY, CHECKPOINT).full_prompt(
            CONVERSATIONS["system-changes"], TOOLS, {}
        )


@pytest.mark.parametrize("conversation", CHECKPOINT_CORPUS, ids=lambda c: c.name)
def test_corpus_on_the_checkpoint_template(conversation: Conversation) -> None:
    prove_on_corpus(checkpoint_renderer(CHECKPOINT_FAMILY, CHECKPOINT), conversation)


def test_what_the_model_writes_diverges_from_the_checkpoint_template_as_declared() -> None:
    """The model writes mistral-common's format ("Let me check.[TOOL_CALLS][...]", the forced-call
    grammar too); the checkpoint template writes the call back alone after "[TOOL_CALLS] [":
    the chain keeps what was sampled, the continuation is the full render's tail
    (``call_content_dropped``, ``call_list_spaced``)."""
    renderer = checkpoint_renderer(CHECKPOINT_FAMILY, CHECKPOINT)
    call = {"name": "run", "arguments": {"command": "x"}, "id": "q1w2e3r4t"}
    assert (
        sampled_call_turn(renderer, "Let me check." + calls_text(call))
        == '[TOOL_CALLS] [{"name": "run", "arguments": {"command": "x"}, "id": "q1w2e3r4t"}]</s>'
    )
    assert {"call_content_dropped", "call_list_spaced"} <= set(MISTRAL.divergences)


# --- Mistral Nemo's own checkpoint template -----------------------------------------------------
# templates/mistral_nemo.jinja (source in cli/dev/tokenizers/mistral.py):
# Mistral-Nemo-Instruct-2407's, a v3 tekken model. Its reference is mistral-common's v3 encoder
# over the same tekken file (which declares v3): what vLLM's Mistral mode serves for Nemo.

NEMO = template_path(recipe.NEMO_TEMPLATE).read_text()
NEMO_CONVERSATIONS = {
    # mistral-common refuses a turn with both text and calls (tools-user-again), the template a
    # later system message.
    **{k: v for k, v in CONVERSATIONS.items() if k in ("chat", "tools", "tools-answer")},
    "system-user-again": [SYSTEM, USER, ANSWER, AGAIN],
}
_STRING_RESULT = re.compile(r'(\[TOOL_RESULTS\]\{"content": )("(?:[^"\\]|\\.)*")(, "call_id": )')


def test_nemo_template_is_detected_as_mistral() -> None:
    assert "[TOOL_CALLS][" in NEMO and "[SYSTEM_PROMPT]" not in NEMO
    assert detect_family(NEMO) is MISTRAL


@pytest.fixture(scope="module")
def v3_reference() -> Any:
    """mistral-common's v3 tokenizer over the tekken file as it is (it declares v3)."""
    return {
        mode: MistralTokenizer.from_file(str(recipe.tekken_file()), mode=mode)
        for mode in (ValidationMode.test, ValidationMode.finetuning)
    }


def as_nemo_writes(text: str, messages: list[Message]) -> str:
    """mistral-common v3's rendering rewritten by every departure of Nemo's template."""
    # Both write the system prompt into the last user turn; the template only while that turn
    # is the last message, nowhere once anything follows it.
    if messages[0].role == "system" and messages[-1].role != "user":
        text = text.replace(messages[0].content + "\n\n", "", 1)
    # A string result raw, not as a JSON string (``content|string``).
    return _STRING_RESULT.sub(lambda m: m[1] + json.loads(m[2]) + m[3], text)


@pytest.mark.parametrize("name", sorted(NEMO_CONVERSATIONS))
@pytest.mark.parametrize("with_tools", [True, False], ids=["tools", "no-tools"])
def test_nemo_template_departs_from_mistral_common_v3_as_declared(
    tokenizer: Any, v3_reference: Any, name: str, with_tools: bool
) -> None:
    messages, tools = NEMO_CONVERSATIONS[name], TOOLS if with_tools else []
    finished = messages[-1].role == "assistant"
    v3 = v3_reference[ValidationMode.finetuning if finished else ValidationMode.test]
    assert type(v3.instruct_tokenizer).__name__ == "InstructTokenizerV3"
    theirs = v3.encode_chat_completion(reference_request(messages, tools)).tokens
    renderer = checkpoint_renderer(CHECKPOINT_FAMILY, NEMO)
    expected = as_nemo_writes(tokenizer.decode(theirs, skip_special_tokens=False), messages)
    assert renderer.render_text(messages, tools, {}, not finished) == expected
    if name in ("chat", "system-user-again"):  # no departure: token for token
        assert renderer.full_prompt(messages, tools, {}, add_generation_prompt=False) == theirs


@pytest.mark.parametrize("conversation", CHECKPOINT_CORPUS, ids=lambda c: c.name)
def test_corpus_on_nemo_template(conversation: Conversation) -> None:
    prove_on_corpus(checkpoint_renderer(CHECKPOINT_FAMILY, NEMO), conversation)


def test_nemo_template_moves_the_system_prompt_as_declared() -> None:
    """The template writes the system prompt into the last message only, when it is a user
    turn: a new user turn takes it from the previous one, and after the model's turn (its tool
    results, or the next user turn's chain) it is gone. No continuation of the chain exists,
    with or without tools: the ingress renders the turn in full, a new chain
    (``system_in_last_user_moved``)."""
    renderer = checkpoint_renderer(CHECKPOINT_FAMILY, NEMO)
    messages = [SYSTEM, USER, ANSWER, AGAIN]
    with pytest.raises(NotAppendOnly):
        renderer.continuation(messages, 3, True, [], {})
    assert renderer.render_text(messages, [], {}, add_generation_prompt=True) == (
        f"<s>[INST]{USER.content}[/INST]{ANSWER.content}</s>"
        f"[INST]{SYSTEM.content}\n\n{AGAIN.content}[/INST]"
    )
    calls = [SYSTEM, USER, CALLS, *RESULTS]
    with pytest.raises(NotAppendOnly):
        renderer.continuation(calls, 3, True, [], {})
    assert SYSTEM.content not in renderer.render_text(calls, [], {}, add_generation_prompt=True)
    assert "system_in_last_user_moved" in MISTRAL.divergences
