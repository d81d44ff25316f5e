"""TITO rendering across chat-template families (invariant: exact tokens, suffix as the template
would emit it after the real prefix)."""

from __future__ import annotations

import json

import pytest

from tests.families import FAMILIES, path_tool
from titoflow.dev.model_build import tokenizer_source_dir
from titoflow.tito.messages import Message, ToolCall
from titoflow.tito.render import ChatRenderer
from titoflow.tito.tokenizer import load_tokenizer, text_encoder

TOOLS = (path_tool("read_file", "Read a file"),)


def call(idx: int, path: str) -> ToolCall:
    return ToolCall(id=f"call_{idx}", name="read_file", arguments=json.dumps({"path": path}))


SYSTEM = Message(role="system", content="You are a careful agent.")
USER = Message(role="user", content="Summarize  README.md\n\n please.")
# (history ending with an assistant turn, new messages), each a shape scaffolds produce.
CASES = {
    "user_turn": (
        [SYSTEM, USER, Message(role="assistant", content="Sure.")],
        [Message(role="user", content="Now  the tests?")],
    ),
    "parallel_tool_results": (
        [
            SYSTEM,
            USER,
            Message(role="assistant", content="", tool_calls=(call(0, "a"), call(1, "b"))),
        ],
        [
            Message(role="tool", content="alpha\n", tool_call_id="call_0"),
            Message(role="tool", content=" beta", tool_call_id="call_1"),
        ],
    ),
    "reasoning_then_tool": (
        [
            USER,
            Message(
                role="assistant",
                content="Reading it.",
                reasoning="The user wants a summary.",
                tool_calls=(call(0, "README.md"),),
            ),
        ],
        [Message(role="tool", content="# titoflow", tool_call_id="call_0")],
    ),
    "reasoning_in_history_then_user": (
        [
            SYSTEM,
            USER,
            Message(role="assistant", content="Reading.", tool_calls=(call(0, "README.md"),)),
            Message(role="tool", content="# titoflow", tool_call_id="call_0"),
            Message(role="assistant", content="It is a proxy.", reasoning="Short answer."),
        ],
        [Message(role="user", content="Thanks!")],
    ),
    "no_system_no_tools_results": (
        [Message(role="user", content="hi"), Message(role="assistant", content="hello")],
        [Message(role="user", content="bye")],
    ),
}


def terminated_prefix(renderer: ChatRenderer, text: str) -> str:
    """What an engine that stopped on the end-of-turn token produced up to: text through the
    last terminator (the template's trailing newline after it is not generated)."""
    return text[: text.rindex(renderer.terminator) + len(renderer.terminator)]


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_continuation_is_what_the_template_emits_after_the_prefix(family: str, case: str) -> None:
    tokenizer = FAMILIES[family]()
    renderer = ChatRenderer(tokenizer)
    history, new = CASES[case]
    tools = TOOLS if any(m.tool_calls for m in history) else ()
    messages = [*history, *new]
    full_text = renderer.render_text(messages, tools, {}, add_generation_prompt=True)
    full_ids = tokenizer.encode(full_text, add_special_tokens=False)
    history_text = renderer.render_text(history, tools, {}, add_generation_prompt=False)

    cont = renderer.continuation(messages, len(history), True, tools, {})

    # The continuation is the tail of the full render, right after the assistant's terminator.
    assert full_ids[-len(cont) :] == cont
    before = full_ids[: -len(cont)]
    assert before[-1] == renderer.terminator_id
    assert before.count(renderer.terminator_id) == tokenizer.encode(
        history_text, add_special_tokens=False
    ).count(renderer.terminator_id)

    # Where the template is append-only for this history, chain + continuation is exactly the
    # full render: nothing is lost or doubled at the seam (the newline after an end-of-turn).
    # The Llama-style template is append-only everywhere; Qwen3's only where no <think> moves.
    assert full_text.startswith(history_text) or family == "qwen3"
    if full_text.startswith(history_text):
        chain = tokenizer.encode(
            terminated_prefix(renderer, history_text), add_special_tokens=False
        )
        assert chain + cont == full_ids


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_length_cut_completion_gets_its_turn_closed(family: str) -> None:
    renderer = ChatRenderer(FAMILIES[family]())
    history, new = CASES["user_turn"]
    closed = renderer.continuation([*history, *new], len(history), True, (), {})
    cut = renderer.continuation([*history, *new], len(history), False, (), {})
    assert cut == [renderer.terminator_id, *closed]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_continuation_cost_does_not_depend_on_history(family: str) -> None:
    """The continuation is rendered from the new messages only: a long history changes nothing."""
    renderer = ChatRenderer(FAMILIES[family]())
    short = [SYSTEM, USER, Message(role="assistant", content="ok")]
    long = [SYSTEM] + [USER, Message(role="assistant", content="ok")] * 200
    new = [Message(role="user", content="next")]
    assert renderer.continuation([*short, *new], 3, True, (), {}) == renderer.continuation(
        [*long, *new], len(long), True, (), {}
    )


def test_qwen3_history_rewrite_is_why_tito_exists() -> None:
    """Qwen3's template drops <think> from earlier turns: re-rendering turn 2 would not reproduce
    the tokens the model generated in turn 1, while the TITO prompt keeps them."""
    tokenizer = FAMILIES["qwen3"]()
    renderer = ChatRenderer(tokenizer)
    turn1 = [SYSTEM, USER]
    prompt1 = renderer.full_prompt(turn1, (), {})
    generated = tokenizer.encode(
        "<think>\nThe user wants a summary.\n</think>\n\nIt is a proxy.<|im_end|>",
        add_special_tokens=False,
    )
    answer = Message(
        role="assistant", content="It is a proxy.", reasoning="The user wants a summary."
    )
    turn2 = [*turn1, answer, Message(role="user", content="Thanks!")]

    tito = prompt1 + generated + renderer.continuation(turn2, 3, True, (), {})
    naive = renderer.full_prompt(turn2, (), {})

    assert tito[: len(prompt1) + len(generated)] == prompt1 + generated
    assert naive[: len(prompt1) + len(generated)] != prompt1 + generated
    assert tokenizer.decode(tito).count("<think>") == 1
    assert "<think>" not in tokenizer.decode(naive)


ENCODED_TEXTS = (
    "",
    "plain words",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|eot_id|> x <|start_header_id|>tool<|end_header_id|>",
    "<think>\n\n</think>\n\nnaïve café 漢字 🙂",
    "  leading\n\n\ttabs and trailing  ",
)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_text_encoder_gives_the_ids_transformers_gives(family: str) -> None:
    tokenizer = FAMILIES[family]()
    encode = text_encoder(tokenizer)
    for text in ENCODED_TEXTS:
        assert encode(text) == tokenizer.encode(text, add_special_tokens=False), text


def test_text_encoder_leaves_a_backend_with_its_own_truncation_to_transformers() -> None:
    tokenizer = load_tokenizer(tokenizer_source_dir())  # a private copy: it is changed below
    tokenizer.backend_tokenizer.enable_truncation(4)
    text = "a sentence of more than four tokens, surely"
    ids = text_encoder(tokenizer)(text)  # before transformers' own call turns truncation off
    assert len(ids) > 4
    assert ids == tokenizer.encode(text, add_special_tokens=False)
