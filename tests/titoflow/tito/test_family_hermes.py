"""Hermes 3: its own templates (``tool_use`` verbatim, a plain ChatML ``default`` beside it, as
its directories ship them) are detected as ``hermes``, not as Qwen3 nor as no family at all; its
calling turns lose their text in history (why it is not Qwen3: Qwen3's template keeps it); its
text ids are Llama 3's and its markers one token each; a forced call names them by id."""

from __future__ import annotations

import json

import pytest

from cli.dev.tokenizers import hermes as recipe
from cli.dev.tokenizers import template_path
from tests.support.corpus import corpus
from tests.support.families import family_tokenizer
from tests.support.hostile import CORPUS as HOSTILE
from tests.support.hostile import MARKERS
from titoflow.tito.families import detect_family, grammar
from titoflow.tito.families.hermes import HERMES, SYSTEM_PROMPT
from titoflow.tito.families.qwen3 import QWEN3
from titoflow.tito.messages import Message, ToolCall
from titoflow.tito.render import ChatRenderer, template_source

TOOLS = list(corpus()[1].tools)
CALL = ToolCall(id="call_1", name="run", arguments=json.dumps({"command": "ls"}))
ASKED = [Message(role="user", content="list it")]


@pytest.fixture(scope="module")
def renderer() -> ChatRenderer:
    return ChatRenderer(family_tokenizer("hermes"))


def test_hermes_templates_are_detected_as_hermes(renderer: ChatRenderer) -> None:
    """The directory carries both named templates; detection reads ``tool_use`` (the one
    requests with tools render with), since ``default`` writes no tool format: read alone it
    is of no known family, which is where a Hermes 3 directory stopped before."""
    templates = renderer.tokenizer.chat_template
    assert set(templates) == {"default", "tool_use"}
    assert template_source(renderer.tokenizer) == templates["tool_use"]
    assert renderer.family is HERMES and renderer.terminator == "<|im_end|>"
    assert detect_family(template_path(recipe.TOOL_USE_TEMPLATE).read_text()) is HERMES
    with pytest.raises(ValueError, match="no known model family"):
        detect_family(templates["default"])
    assert SYSTEM_PROMPT not in family_tokenizer("qwen3").chat_template
    assert detect_family(family_tokenizer("qwen3").chat_template) is QWEN3


def test_requests_with_and_without_tools_render_as_hermes_3(renderer: ChatRenderer) -> None:
    plain = renderer.render_text(ASKED, (), {}, True)
    assert plain == "<|begin_of_text|><|im_start|>user\nlist it<|im_end|>\n<|im_start|>assistant\n"
    with_tools = renderer.render_text(ASKED, TOOLS, {}, True)
    assert with_tools.startswith(f"<|begin_of_text|><|im_start|>system\n{SYSTEM_PROMPT}")
    assert with_tools.endswith("<|im_start|>user\nlist it<|im_end|>\n<|im_start|>assistant\n")


def test_a_calling_turn_loses_its_text_in_history(renderer: ChatRenderer) -> None:
    """Why Hermes is not Qwen3 (whose template keeps the text, and whose corpus proof fails on
    Hermes 3's template for it): ``content_with_calls=False``, ``call_content_dropped``."""
    turn = Message(role="assistant", content="Let me look.", tool_calls=(CALL,))
    text = renderer.render_text([*ASKED, turn], TOOLS, {}, False)
    assert "Let me look." not in text
    assert text.endswith(
        '<|im_start|>assistant\n<tool_call>\n{"name": "run", "arguments": {"command": "ls"}}\n'
        "</tool_call><|im_end|>\n"
    )
    qwen3 = ChatRenderer(family_tokenizer("qwen3"))
    assert "Let me look." in qwen3.render_text([*ASKED, turn], TOOLS, {}, False)
    assert not HERMES.content_with_calls and HERMES.divergences == ("call_content_dropped",)


def test_text_ids_are_llama_3s_and_markers_one_token(renderer: ChatRenderer) -> None:
    """Text (the hostile strings but the ChatML ones, whose markers are Hermes' own tokens here)
    encodes to Meta's Llama 3 ids; each marker is one token after Llama 3's 128,256."""
    llama = family_tokenizer("llama3")
    texts = [t for t in HOSTILE if "<|im_start|>" not in t and "<tool_call>" not in t]
    assert len(texts) == len(HOSTILE) - 2 and MARKERS[0] in HOSTILE
    for text in texts:
        assert renderer.encode(text) == llama.encode(text, add_special_tokens=False), text
    markers = [*recipe.SPECIALS, *recipe.MARKERS]
    assert [renderer.token_id(m) for m in markers] == list(range(128256, 128256 + len(markers)))


def test_a_forced_call_names_the_markers_by_id(renderer: ChatRenderer) -> None:
    constraint = grammar.tool_call_constraint(
        HERMES, TOOLS[:2], "required", None, renderer.token_id
    )
    assert constraint is not None
    text = constraint["structured_outputs"]["structural_tag"]
    assert '"token":128258' in text and '"token":128259' in text  # <tool_call>, </tool_call>
