"""The Mistral v11 family (Small 3.2, Devstral Small 2507): its tokenizer against a released v11
tokenizer's ids and mistral-common's own v11 encoding, its templates (mistral-common's and the
checkpoints' own), its parser and its grammar.

The proof that the tokenizer and the template are right: the text of mistral-common's test
manifest for a released v11 ``tekken.json`` encodes to exactly that manifest's ids, and every
conversation of the v7 family's tests, rendered with the HF template and encoded with the HF
tokenizer, gives exactly the ids mistral-common's ``MistralTokenizer`` (v11) gives.
"""

from __future__ import annotations

import functools
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cli.dev.tokenizers import mistral_v11 as recipe
from cli.dev.tokenizers import template_path
from tests.support.corpus import Conversation
from tests.support.families import family_tokenizer
from tests.support.mistral_family import (
    ANSWER,
    CALLS,
    CHECKPOINT_CORPUS,
    CONVERSATIONS,
    SAY_AND_CALL,
    TOOLS,
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
    sampled_call_turn,
)
from titoflow.tito.families import detect_family
from titoflow.tito.families.base import tool_call_id
from titoflow.tito.families.grammar import tool_call_constraint
from titoflow.tito.families.mistral import MISTRAL, TOOL_CALLS
from titoflow.tito.families.mistral_v11 import ARGS, CALL_ID, MISTRAL_V11
from titoflow.tito.messages import Message
from titoflow.tito.output import TextDelta, ToolCallDone
from titoflow.tito.render import ChatRenderer

RELEASED = Path(__file__).parent / "fixtures" / "mistral_v11" / "released_v11_weather.json"


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return family_tokenizer("mistral_v11")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """mistral-common's v11 tokenizer over the recipe's tekken file."""
    return mistral_common_tokenizers(recipe.tekken_v11(), tmp_path_factory.mktemp("tekken"))


def test_template_is_mistral_commons_own() -> None:
    assert template_path(recipe.TEMPLATE).read_text() == generated_template("v11")


def test_a_released_v11_tokenizers_ids(tokenizer: Any) -> None:
    """mistral-common's manifest of a conversation encoded with a released v11 tekken.json:
    the control tokens' ranks ([ARGS] 32, [CALL_ID] 33) and the vocabulary are that file's."""
    released = json.loads(RELEASED.read_text())
    ids = tokenizer.encode(released["decoded_text"], add_special_tokens=False)
    assert ids == released["token_ids"]
    assert tokenizer.convert_tokens_to_ids([ARGS, CALL_ID, TOOL_CALLS]) == [32, 33, 9]


@pytest.mark.parametrize(
    "text",
    ["Hello world", "数字 12345 ünïcödé 🎉 zero\u200bwidth", "  \n\n\ttabs  \r\n x", "{}[]"],
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


SMALL_3_2 = template_path(recipe.SMALL_3_2_TEMPLATE).read_text()
DEVSTRAL = template_path(recipe.DEVSTRAL_TEMPLATE).read_text()


def test_detection() -> None:
    for template in (generated_template("v11"), generated_template("v13"), SMALL_3_2, DEVSTRAL):
        assert detect_family(template) is MISTRAL_V11
    # Small 3.1's own template and mistral-common's v7 stay the v7 family.
    small_3_1 = template_path("mistral_small_3_1.jinja").read_text()
    for template in (generated_template("v7"), small_3_1):
        assert detect_family(template) is MISTRAL


def test_turn_end_and_markers(tokenizer: Any) -> None:
    renderer = ChatRenderer(tokenizer)
    assert renderer.family is MISTRAL_V11
    assert renderer.terminator == "</s>" and renderer.stop_token_ids == (2,)
    assert renderer.assistant_opening() == []


parse = functools.partial(parse_output, MISTRAL_V11)


def test_content_then_calls_with_and_without_ids() -> None:
    text = (
        "Let me look."
        + '[TOOL_CALLS]read_file[CALL_ID]abcDEF123[ARGS]{"path": "ü"}'
        + "[TOOL_CALLS]list_dir[ARGS]{}"
        + '[TOOL_CALLS]run{"command": "x"}'  # no [ARGS]: as vLLM reads it
    )
    deltas, out = parse(text)
    assert out.content == "Let me look." and out.parse_error is None and out.reasoning is None
    own = tool_call_id("step-1", 1, prefix="")[:9]
    assert [(c.id, c.name, json.loads(c.arguments)) for c in out.tool_calls] == [
        ("abcDEF123", "read_file", {"path": "ü"}),
        (own, "list_dir", {}),
        (tool_call_id("step-1", 2, prefix="")[:9], "run", {"command": "x"}),
    ]
    assert [type(d) for d in deltas] == [TextDelta, ToolCallDone, ToolCallDone, ToolCallDone]


@pytest.mark.parametrize(
    "calls, why",
    [
        ('run[ARGS]{"command": ', "invalid JSON"),
        ("run[ARGS]{} and more", "text after the arguments"),
        ('run[ARGS]"x"', "not a JSON object"),
        ("run[ARGS]", "invalid JSON"),
        ("[ARGS]{}", "bad name"),
        ("my tool[ARGS]{}", "bad name"),
        ("run[CALL_ID]call_1[ARGS]{}", "not 9 letters or digits"),
        ("run[CALL_ID]abcdefghi", "no [ARGS]"),
        ("run", "no [ARGS]"),
        ("run[ARGS]{}[TOOL_CALLS]", "call 1: no [ARGS]"),
    ],
)
def test_malformed_calls_come_back_as_generated(calls: str, why: str) -> None:
    assert_malformed_call_comes_back(MISTRAL_V11, calls, why)


def test_without_tools_call_syntax_stays_text() -> None:
    text = "x[TOOL_CALLS]run[ARGS]{}"
    _, out = parse(text, parse_tools=False)
    assert out.content == text and out.tool_calls == [] and out.parse_error is None


def test_unread_control_tokens_are_dropped_from_content_call_syntax_kept() -> None:
    _, out = parse("a[INST]b[ARGS]<SPECIAL_42></s>c[CALL_ID] [NOTE]")
    assert out.content == "ab[ARGS]c[CALL_ID] [NOTE]" and out.parse_error is None


STREAMED = [
    'Sure.[TOOL_CALLS]read_file[CALL_ID]a1B2c3D4e[ARGS]{"path": "[/INST]"}',
    "a[INST]b[IN[/SYSTEM_PROMPT]<SPECIAL_7> [TOOL_CALL [ARG [TOOL_CALLS",
    'Hi [TOOL_CALLS]run[ARGS]{"x": "[TOOL_CALLS]"}',
    '[TOOL_CALLS]a[ARGS]{"k": [1, {"z": null}]}[TOOL_CALLS]b{}\n',
]


@pytest.mark.parametrize("text", STREAMED)
def test_streaming_equals_whole_on_every_split(text: str) -> None:
    assert_streaming_equals_whole(MISTRAL_V11, text)


@pytest.mark.parametrize("assistant", [CALLS, SAY_AND_CALL, ANSWER], ids=["calls", "both", "text"])
def test_rendered_turn_parses_back_and_renders_the_same(tokenizer: Any, assistant: Message) -> None:
    assert_turn_parses_back(tokenizer, assistant)


def test_forced_call_grammar(tokenizer: Any) -> None:
    renderer = ChatRenderer(tokenizer)
    constraint = tool_call_constraint(
        MISTRAL_V11, TOOLS, "named", "run", renderer.token_id, parallel=True
    )
    assert constraint is not None
    tag = json.loads(constraint["structured_outputs"]["structural_tag"])
    first, more = tag["format"]["elements"]
    assert first["elements"][0] == {"type": "token", "token": 9}, "[TOOL_CALLS] by its id"
    name, call_id, identifier, args, arguments = first["elements"][1]["elements"]
    assert name == {"type": "const_string", "value": "run"}
    assert (call_id, args) == ({"type": "token", "token": 33}, {"type": "token", "token": 32})
    assert identifier == {"type": "regex", "pattern": "[A-Za-z0-9]{9}"}
    assert arguments["json_schema"] == TOOLS[1]["function"]["parameters"]
    assert more["content"] == first, "each further call opens with its own [TOOL_CALLS]"


def test_the_template_rejects_ids_of_another_shape(tokenizer: Any) -> None:
    assert_ids_of_another_shape_refused(tokenizer)


# --- The checkpoints' own templates ---------------------------------------------------------------
# Small 3.2's (mistralai/Mistral-Small-3.2-24B-Instruct-2506) and Devstral Small 2507's (as
# unsloth republished it), sources in cli/dev/tokenizers/mistral_v11.py.


# Small 3.2's writes a calling turn's calls alone; Devstral's its text too. Both refuse a
# system message after the first (Small 3.2: roles must alternate once it is taken out;
# Devstral: alike by its role check).
CHECKPOINTS = {
    "small_3_2": (replace(MISTRAL_V11, content_with_calls=False), SMALL_3_2),
    "devstral": (MISTRAL_V11, DEVSTRAL),
}


@pytest.mark.parametrize("conversation", CHECKPOINT_CORPUS, ids=lambda c: c.name)
@pytest.mark.parametrize("template", ["small_3_2", "devstral"])
def test_corpus_on_the_checkpoint_templates(conversation: Conversation, template: str) -> None:
    prove_on_corpus(checkpoint_renderer(*CHECKPOINTS[template]), conversation)


def test_what_the_model_writes_diverges_from_small_3_2s_template_as_declared() -> None:
    """The model (and mistral-common, and the grammar) writes text before its calls; Small
    3.2's template writes a calling turn's calls alone: the chain keeps what was sampled, the
    continuation is the full render's tail (``call_content_dropped``)."""
    renderer = checkpoint_renderer(*CHECKPOINTS["small_3_2"])
    call = '[TOOL_CALLS]run[CALL_ID]q1w2e3r4t[ARGS]{"command": "x"}'
    assert sampled_call_turn(renderer, "Let me check." + call) == call + "</s>"
    assert "call_content_dropped" in MISTRAL_V11.divergences
