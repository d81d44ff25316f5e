"""The Magistral family (Magistral Small 2506: Mistral v11 with ``<think>`` text reasoning): its
directory is ``mistral_v11``'s but for the template, the template is mistral-common's own and
writes every turn's reasoning back as the model wrote it, and the parser splits the reasoning
off as vLLM's ``mistral`` reasoning parser does. Parity with vLLM's parsers is in
test_parser_parity.py, the corpus proof in test_family_corpus.py.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
from mistral_common.protocol.instruct.validator import ValidationMode

from cli.dev.stamped import read_stamp
from cli.dev.tokenizers import STAMP, template_path, tokenizer_dir
from cli.dev.tokenizers import magistral as recipe
from cli.dev.tokenizers import mistral_v11 as v11_recipe
from tests.support.families import family_tokenizer
from tests.support.mistral_family import (
    AGAIN,
    CALLS,
    SAY_AND_CALL,
    SYSTEM,
    TOOLS,
    USER,
    assert_streaming_equals_whole,
    assert_turn_parses_back,
    generated_template,
    mistral_common_tokenizers,
    parse_output,
    reference_request,
)
from titoflow.tito.families import detect_family
from titoflow.tito.families.magistral import MAGISTRAL
from titoflow.tito.families.mistral_v11 import MISTRAL_V11
from titoflow.tito.messages import Message
from titoflow.tito.output import ReasoningDelta, TextDelta, ToolCallDone
from titoflow.tito.render import ChatRenderer

TEMPLATE = template_path(recipe.TEMPLATE).read_text()
CALL = '[TOOL_CALLS]run[CALL_ID]q1w2e3r4t[ARGS]{"command": "x"}'


@pytest.fixture(scope="module")
def renderer() -> ChatRenderer:
    return ChatRenderer(family_tokenizer("magistral"))


def test_template_is_mistral_commons_plain_thinking_one() -> None:
    assert generated_template("v11", plain_thinking=True) == TEMPLATE


def test_the_directory_is_mistral_v11s_but_the_template() -> None:
    ours, v11 = tokenizer_dir("magistral"), tokenizer_dir("mistral_v11")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (ours / name).read_bytes() == (v11 / name).read_bytes(), name
    assert (ours / recipe.CHAT_TEMPLATE_FILE).read_text() == TEMPLATE
    assert read_stamp(ours, STAMP)["stand_in"] == ""


def test_detection() -> None:
    assert detect_family(TEMPLATE) is MAGISTRAL
    # The v11 templates that write no reasoning stay mistral_v11, and so does v13's without
    # thinking (v13's with [THINK] is magistral_v13: another format, not this family).
    for template in (
        generated_template("v11"),
        template_path(v11_recipe.SMALL_3_2_TEMPLATE).read_text(),
        template_path(v11_recipe.DEVSTRAL_TEMPLATE).read_text(),
        generated_template("v13"),
    ):
        assert detect_family(template) is MISTRAL_V11


REASONED = Message(role="assistant", content="Done: the test passes.", reasoning="It is x.\n")


def test_every_turns_reasoning_is_written_back(renderer: ChatRenderer) -> None:
    """Before and after the last user message alike: the history is as sampled."""
    messages = [SYSTEM, USER, REASONED, AGAIN]
    text = renderer.tokenizer.decode(renderer.full_prompt(messages, TOOLS, {}))
    assert "[/INST]<think>It is x.\n</think>Done: the test passes.</s>" in text


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """mistral-common's v11 tokenizer: Magistral's (the same tekken file as Small 3.2's)."""
    return mistral_common_tokenizers(v11_recipe.tekken_v11(), tmp_path_factory.mktemp("tekken"))


@pytest.mark.parametrize("assistant", [REASONED, SAY_AND_CALL], ids=["answer", "call"])
def test_reasoning_encodes_as_text_as_mistral_common_does(
    renderer: ChatRenderer, reference: Any, assistant: Message
) -> None:
    """mistral-common's v11 encoder has no thinking chunk: Magistral's reasoning is text, the
    ``<think>`` block leading the content, which is what the template writes."""
    reasoned = assistant.model_copy(update={"reasoning": "Plan: 漢字 🙂"})
    messages = [SYSTEM, USER, reasoned]
    ours = renderer.full_prompt(messages, TOOLS, {}, add_generation_prompt=False)
    as_text = reasoned.model_copy(
        update={"reasoning": None, "content": f"<think>Plan: 漢字 🙂</think>{assistant.content}"}
    )
    request = reference_request([SYSTEM, USER, as_text], TOOLS)
    assert ours == reference[ValidationMode.finetuning].encode_chat_completion(request).tokens


parse = functools.partial(parse_output, MAGISTRAL)


def test_reasoning_then_content_then_calls() -> None:
    deltas, out = parse("<think>Look first.\n</think>Let me check." + CALL)
    assert out.reasoning == "Look first.\n" and out.content == "Let me check."
    assert out.parse_error is None and [c.id for c in out.tool_calls] == ["q1w2e3r4t"]
    assert [type(d) for d in deltas] == [ReasoningDelta, TextDelta, ToolCallDone]


def test_without_a_think_block_it_is_mistral_v11s() -> None:
    _, out = parse("Let me check." + CALL)
    assert out.reasoning is None and out.content == "Let me check." and len(out.tool_calls) == 1
    _, out = parse("a <think>b</think>")  # only a leading block is reasoning
    assert out.reasoning is None and out.content == "a <think>b</think>"


def test_a_call_ends_the_reasoning_as_in_vllm() -> None:
    _, out = parse("<think>Maybe" + CALL)
    assert (out.reasoning, out.content, out.parse_error) == ("Maybe", "", None)
    assert [c.name for c in out.tool_calls] == ["run"]
    # Its closer after the calls ends them; what follows is content.
    _, out = parse("<think>Maybe" + CALL + "</think>Done.")
    assert (out.reasoning, out.content, out.parse_error) == ("Maybe", "Done.", None)
    assert [c.name for c in out.tool_calls] == ["run"]


def test_a_malformed_call_run_comes_back_as_generated_closer_and_all() -> None:
    run = '[TOOL_CALLS]run[ARGS]{"command": </think>Done.'
    _, out = parse("<think>Maybe" + run)
    assert out.reasoning == "Maybe" and out.content == run and out.tool_calls == []
    assert out.parse_error is not None


def test_without_tools_a_call_stays_reasoning() -> None:
    _, out = parse("<think>Maybe" + CALL + "</think>Done.", parse_tools=False)
    assert (out.reasoning, out.content) == ("Maybe" + CALL, "Done.")


def test_reasoning_never_closed_is_all_reasoning_control_tokens_dropped() -> None:
    _, out = parse("<think>Still [INST]thinking<SPECIAL_7>")
    assert (out.reasoning, out.content, out.parse_error) == ("Still thinking", "", None)


STREAMED = [
    "<think>Look first.\n</think>Let me check." + CALL,
    "  <think>Maybe" + CALL + "</think>Done.",
    "<thin",
    "<think>a</thi",
    "<think>x[TOOL_CALL [INST]</think>y[TOOL_CALLS",
]


@pytest.mark.parametrize("text", STREAMED)
def test_streaming_equals_whole_on_every_split(text: str) -> None:
    assert_streaming_equals_whole(MAGISTRAL, text)


REASONED_TURNS = [
    REASONED,
    SAY_AND_CALL.model_copy(update={"reasoning": "Check first."}),
    CALLS.model_copy(update={"reasoning": "Three calls:\n\n- read, run, list.\n"}),
]


@pytest.mark.parametrize("assistant", REASONED_TURNS, ids=["text", "both", "calls"])
def test_rendered_turn_parses_back_and_renders_the_same(
    renderer: ChatRenderer, assistant: Message
) -> None:
    assert_turn_parses_back(renderer.tokenizer, assistant)


def test_grammar_and_history_are_mistral_v11s() -> None:
    assert MAGISTRAL.grammar is MISTRAL_V11.grammar
    assert MAGISTRAL.native_call_id is MISTRAL_V11.native_call_id
    assert "reasoning_dropped" not in MAGISTRAL.divergences
