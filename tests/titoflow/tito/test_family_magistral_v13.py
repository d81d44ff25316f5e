"""The Magistral v13 family (Magistral Small 2507/2509: Mistral tekken v13 with ``[THINK]``
control tokens): its tokenizer against mistral-common's manifests of a released v13
``tekken.json``, its template against mistral-common's own conversion of that file and its v13
request encoder (every conversation, with reasoning in every assistant turn, token for token),
what the template writes back, and the parser splitting the reasoning off as vLLM's ``mistral``
reasoning parser does. Parity with vLLM's parsers is in test_parser_parity.py, the corpus proof
in test_family_corpus.py.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
from mistral_common.integrations.chat_templates.chat_templates import (
    convert_tokenizer_to_chat_template,
)
from mistral_common.protocol.instruct.validator import ValidationMode

from cli.dev.stamped import read_stamp
from cli.dev.tokenizers import STAMP, template_path, tokenizer_dir
from cli.dev.tokenizers import magistral as magistral_recipe
from cli.dev.tokenizers import magistral_v13 as recipe
from cli.dev.tokenizers import mistral_v11 as v11_recipe
from tests.support.families import family_tokenizer
from tests.support.mistral_family import (
    AGAIN,
    CALLS,
    CONVERSATIONS,
    SAY_AND_CALL,
    SYSTEM,
    TOOLS,
    USER,
    assert_streaming_equals_whole,
    assert_turn_parses_back,
    call,
    generated_template,
    mistral_common_tokenizers,
    parse_output,
    reference_request,
)
from tests.support.xgrammar_check import admitted, structural_tag
from titoflow.tito.families import detect_family
from titoflow.tito.families.grammar import ToolChoice
from titoflow.tito.families.magistral import MAGISTRAL
from titoflow.tito.families.magistral_v13 import MAGISTRAL_V13
from titoflow.tito.families.mistral_v11 import MISTRAL_V11
from titoflow.tito.messages import Message
from titoflow.tito.output import ReasoningDelta, TextDelta, ToolCallDone
from titoflow.tito.render import ChatRenderer

TEMPLATE = template_path(recipe.TEMPLATE).read_text()
FIXTURES = Path(__file__).parent / "fixtures" / "magistral_v13"
CALL = '[TOOL_CALLS]run[ARGS]{"command": "x"}'
RUN = {"command": "x", "timeout": 3}


@pytest.fixture(scope="module")
def renderer() -> ChatRenderer:
    return ChatRenderer(family_tokenizer("magistral_v13"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """mistral-common's v13 tokenizer over the recipe's tekken file."""
    return mistral_common_tokenizers(recipe.tekken_v13(), tmp_path_factory.mktemp("tekken"))


def test_template_is_mistral_commons_conversion_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "tekken.json"
    path.write_text(json.dumps(recipe.tekken_v13(), ensure_ascii=False))
    assert convert_tokenizer_to_chat_template(path) == TEMPLATE
    assert (tokenizer_dir("magistral_v13") / "chat_template.jinja").read_text() == TEMPLATE
    assert read_stamp(tokenizer_dir("magistral_v13"), STAMP)["stand_in"] == ""


@pytest.mark.parametrize("name", ["released_v13_weather.json", "released_v13_system_think.json"])
def test_a_released_v13_tokenizers_ids(renderer: ChatRenderer, name: str) -> None:
    """mistral-common's manifests of a released v13 tekken.json (Magistral Small 2507's):
    ``[THINK]`` 34, ``[/THINK]`` 35, ``[ARGS]`` 32 and the vocabulary are that file's."""
    released = json.loads((FIXTURES / name).read_text())
    assert renderer.encode(released["decoded_text"]) == released["token_ids"]
    markers = ["[THINK]", "[/THINK]", "[ARGS]", "[TOOL_CALLS]"]
    assert [renderer.token_id(marker) for marker in markers] == [34, 35, 32, 9]


def test_detection() -> None:
    assert detect_family(TEMPLATE) is MAGISTRAL_V13
    # v11's templates, Magistral Small 2506's <think> one and v13's without thinking are not it.
    for template, family in (
        (generated_template("v11"), MISTRAL_V11),
        (template_path(v11_recipe.SMALL_3_2_TEMPLATE).read_text(), MISTRAL_V11),
        (template_path(v11_recipe.DEVSTRAL_TEMPLATE).read_text(), MISTRAL_V11),
        (generated_template("v13"), MISTRAL_V11),
        (template_path(magistral_recipe.TEMPLATE).read_text(), MAGISTRAL),
    ):
        assert detect_family(template) is family


REASONED = Message(role="assistant", content="Done: the test passes.", reasoning="It is x.\n")
REASONED_TURNS = [
    REASONED,
    SAY_AND_CALL.model_copy(update={"reasoning": "Check first."}),
    CALLS.model_copy(update={"reasoning": "Three calls:\n\n- read, run, list.\n"}),
]


def reasoned(messages: list[Message]) -> list[Message]:
    """Every assistant turn of ``messages`` with reasoning before its content."""
    return [
        m.model_copy(update={"reasoning": f"Plan {i}: 漢字 🙂\n"}) if m.role == "assistant" else m
        for i, m in enumerate(messages)
    ]


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("thinking", [True, False], ids=["reasoned", "plain"])
@pytest.mark.parametrize("with_tools", [True, False], ids=["tools", "no-tools"])
def test_conversations_encode_as_mistral_commons_v13_encoder(
    renderer: ChatRenderer, reference: Any, name: str, thinking: bool, with_tools: bool
) -> None:
    """The v13 encoder is the judge: reasoning as a thinking chunk (``[THINK]R[/THINK]``), the
    tools before the first user message, calls and results without ids. A finished conversation
    in its fine-tuning mode, a prompt in its serving one."""
    messages = reasoned(CONVERSATIONS[name]) if thinking else CONVERSATIONS[name]
    tools = TOOLS if with_tools else []
    finished = messages[-1].role == "assistant"
    ours = renderer.full_prompt(messages, tools, {}, add_generation_prompt=not finished)
    mode = ValidationMode.finetuning if finished else ValidationMode.test
    theirs = reference[mode].encode_chat_completion(reference_request(messages, tools)).tokens
    assert ours == theirs, renderer.tokenizer.decode(ours, skip_special_tokens=False)


def test_every_turns_reasoning_and_no_id_is_written_back(renderer: ChatRenderer) -> None:
    """Before and after the last user message alike: the history is as sampled."""
    called = SAY_AND_CALL.model_copy(update={"reasoning": "Check."})
    result = Message(role="tool", content="ok", tool_call_id="q1w2e3r4t")
    messages = [SYSTEM, USER, REASONED, AGAIN, called, result]
    text = renderer.tokenizer.decode(renderer.full_prompt(messages, TOOLS, {}))
    assert "[/INST][THINK]It is x.\n[/THINK]Done: the test passes.</s>" in text
    assert text.endswith(
        f"[THINK]Check.[/THINK]Let me check.{CALL}</s>[TOOL_RESULTS]ok[/TOOL_RESULTS]"
    )
    assert text.index("[AVAILABLE_TOOLS]") < text.index("[INST]")  # once, first


parse = functools.partial(parse_output, MAGISTRAL_V13)


def test_reasoning_then_content_then_calls() -> None:
    deltas, out = parse("[THINK]Look first.\n[/THINK]Let me check." + CALL)
    assert out.reasoning == "Look first.\n" and out.content == "Let me check."
    assert out.parse_error is None and [c.name for c in out.tool_calls] == ["run"]
    assert [type(d) for d in deltas] == [ReasoningDelta, TextDelta, ToolCallDone]


def test_without_a_think_block_it_is_content() -> None:
    _, out = parse("Let me check." + CALL)
    assert out.reasoning is None and out.content == "Let me check." and len(out.tool_calls) == 1
    _, out = parse("a [THINK]b[/THINK]")  # only a leading block is reasoning
    assert out.reasoning is None and out.content == "a [THINK]b[/THINK]"
    _, out = parse("<think>b</think>")  # v11's text markers are not v13's
    assert out.reasoning is None and out.content == "<think>b</think>"


def test_a_call_ends_the_reasoning_as_in_vllm() -> None:
    _, out = parse("[THINK]Maybe" + CALL)
    assert (out.reasoning, out.content, out.parse_error) == ("Maybe", "", None)
    _, out = parse("[THINK]Maybe" + CALL + "[/THINK]Done.")
    assert (out.reasoning, out.content, out.parse_error) == ("Maybe", "Done.", None)
    assert [c.name for c in out.tool_calls] == ["run"]


def test_without_tools_a_call_stays_reasoning() -> None:
    _, out = parse("[THINK]Maybe" + CALL + "[/THINK]Done.", parse_tools=False)
    assert (out.reasoning, out.content) == ("Maybe" + CALL, "Done.")


STREAMED = [
    "[THINK]Look first.\n[/THINK]Let me check." + CALL,
    "  [THINK]Maybe" + CALL + "[/THINK]Done.",
    "[THIN",
    "[THINK]a[/THI",
    "[THINK]x[TOOL_CALL [INST][/THINK]y[TOOL_CALLS",
]


@pytest.mark.parametrize("text", STREAMED)
def test_streaming_equals_whole_on_every_split(text: str) -> None:
    assert_streaming_equals_whole(MAGISTRAL_V13, text)


@pytest.mark.parametrize("assistant", REASONED_TURNS, ids=["text", "both", "calls"])
def test_rendered_turn_parses_back_and_renders_the_same(
    renderer: ChatRenderer, assistant: Message
) -> None:
    """The parser's own ids stand for the turn's: the template writes none."""
    own = parse("x" + CALL * len(assistant.tool_calls))[1].tool_calls
    ids = tuple(
        c.model_copy(update={"id": o.id}) for c, o in zip(assistant.tool_calls, own, strict=True)
    )
    assert_turn_parses_back(renderer.tokenizer, assistant.model_copy(update={"tool_calls": ids}))


def test_xgrammar_admits_what_the_template_writes_and_refuses_the_rest(
    renderer: ChatRenderer,
) -> None:
    """Compiled by xgrammar on the family's vocabulary: the template's call turn is admitted
    (the markers by id), then ``</s>`` ends it; an undeclared tool, a mistyped argument and
    v11's ``[CALL_ID]`` are not. With reasoning on, a ``[THINK]`` block may lead."""
    history = [SYSTEM, USER]
    turn = Message(role="assistant", content="", tool_calls=(call("q1w2e3r4t", "run", **RUN),))
    full = renderer.full_prompt([*history, turn], TOOLS, {}, add_generation_prompt=False)
    written = full[len(renderer.full_prompt(history, TOOLS, {})) : -1]
    run = renderer.tokenizer.decode(written, skip_special_tokens=False)
    assert run == '[TOOL_CALLS]run[ARGS]{"command": "x", "timeout": 3}'

    def tag(choice: ToolChoice, **options: Any) -> str:
        return structural_tag(MAGISTRAL_V13, TOOLS, choice, renderer.token_id, **options)

    assert '"type":"token","token":32' in tag("named")
    cases = {
        "named": (tag("named"), run),
        "parallel": (tag("required", parallel=True), run + "[TOOL_CALLS]list_dir[ARGS]{}"),
        "reasoned": (tag("required", reasoning=True), "[THINK]Run it.[/THINK]" + run),
        "undeclared": (tag("required"), run.replace("run", "rm")),
        "mistyped": (tag("required"), run.replace('"x"', "3")),
        "with_id": (tag("required"), run.replace("[ARGS]", "[CALL_ID]q1w2e3r4t[ARGS]")),
    }
    assert admitted("magistral_v13", "</s>", cases) == {
        "named": True,
        "parallel": True,
        "reasoned": True,
        "undeclared": False,
        "mistyped": False,
        "with_id": False,
    }
