"""TITO on GLM-4.5+: an assistant turn has no end-of-turn token, the model stops by sampling
the next message's opener (``<|observation|>`` after calls, ``<|user|>`` after an answer), and
the template writes that opener only when the next message comes. A chain that ends with the
opener the next message needs continues right after it; any other chain gets the template's
opener after its own last token, which it keeps."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cli.dev.tokenizers import template_path
from tests.support.families import family_tokenizer
from titoflow.tito.messages import Message, ToolCall
from titoflow.tito.render import ChatRenderer

USER_ID, OBSERVATION_ID, ENDOFTEXT_ID, ASSISTANT_ID = 151336, 151338, 151329, 151337
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]
TEMPLATE_FILES = {"glm45": None, "glm47": template_path("glm47.jinja")}


def renderer(template: str = "glm45") -> ChatRenderer:
    tokenizer = family_tokenizer("glm45")
    path = TEMPLATE_FILES[template]
    if path is None:
        return ChatRenderer(tokenizer)
    # A copy: the cached tokenizer keeps GLM-4.5's template.
    other = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    other.chat_template = path.read_text()
    return ChatRenderer(other)


def call(idx: int, path: str) -> ToolCall:
    return ToolCall(id=f"call_{idx}", name="read_file", arguments=json.dumps({"path": path}))


SYSTEM = Message(role="system", content="You are a careful agent.")
USER = Message(role="user", content="Summarize  README.md\n\n please.")
CALLING = Message(role="assistant", content="Reading.", tool_calls=(call(0, "README.md"),))
RESULT = Message(role="tool", content="# titoflow\n", tool_call_id="call_0")
# (history ending with an assistant turn, new messages, the token the model stopped on)
CASES: dict[str, tuple[list[Message], list[Message], int]] = {
    "tool_result": ([SYSTEM, USER, CALLING], [RESULT], OBSERVATION_ID),
    "parallel_results": (
        [USER, Message(role="assistant", tool_calls=(call(0, "a"), call(1, "b")))],
        [
            Message(role="tool", content="alpha", tool_call_id="call_0"),
            Message(role="tool", content=" beta", tool_call_id="call_1"),
        ],
        OBSERVATION_ID,
    ),
    "reasoning_then_tool": (
        [
            USER,
            Message(
                role="assistant",
                content="",
                reasoning="Need the file.",
                tool_calls=CALLING.tool_calls,
            ),
        ],
        [RESULT],
        OBSERVATION_ID,
    ),
    "user_turn": ([SYSTEM, USER, Message(role="assistant", content="Sure.")], [USER], USER_ID),
    "after_a_tool_loop": (
        [SYSTEM, USER, CALLING, RESULT, Message(role="assistant", content="It is a proxy.")],
        [Message(role="user", content="Thanks!")],
        USER_ID,
    ),
}


def ids(renderer: ChatRenderer, text: str) -> list[int]:
    return renderer.encode(text)


def sampled_chain(
    renderer: ChatRenderer, history: list[Message], end: int, kwargs: dict[str, Any]
) -> list[int]:
    """What the engine holds after the last turn: the template's rendering of the history (the
    prompt and what the model generated, as the template writes it) and the stop token."""
    text = renderer.render_text(history, TOOLS, kwargs, add_generation_prompt=False)
    return [*ids(renderer, text), end]


def test_the_terminator_is_the_next_turns_opener() -> None:
    r = renderer()
    assert (r.terminator, r.terminator_id, r.closes_turn) == ("<|user|>", USER_ID, False)
    assert r.stop_token_ids == (USER_ID, OBSERVATION_ID, ENDOFTEXT_ID)
    assert r.end_ids == {USER_ID, OBSERVATION_ID, ENDOFTEXT_ID}
    assert r.assistant_opening() == [ASSISTANT_ID]  # the model writes "\n<think>…" itself


@pytest.mark.parametrize("template", sorted(TEMPLATE_FILES))
@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": False}], ids=["default", "no_think"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_chain_plus_continuation_is_the_full_render(
    template: str, kwargs: dict[str, Any], case: str
) -> None:
    """The model stopped on the opener the next message needs: the continuation starts right
    after it, and chain + continuation is exactly the template's full render (every case keeps
    the history's rendering: no reasoning before a new user message)."""
    r = renderer(template)
    history, new, end = CASES[case]
    chain = sampled_chain(r, history, end, kwargs)
    full = ids(r, r.render_text([*history, *new], TOOLS, kwargs, add_generation_prompt=True))
    cont = r.continuation([*history, *new], len(history), end, TOOLS, kwargs)
    assert cont[0] != end  # not doubled
    assert chain + cont == full


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_length_cut_gets_the_opener_from_the_template(case: str) -> None:
    r = renderer()
    history, new, end = CASES[case]
    closed = r.continuation([*history, *new], len(history), end, TOOLS, {})
    cut = r.continuation([*history, *new], len(history), None, TOOLS, {})
    assert cut == [end, *closed]


def test_a_turn_that_stopped_on_another_opener_keeps_it() -> None:
    """The model called a tool but stopped on <|user|> (or <|endoftext|>): the chain keeps the
    sampled token and the template's <|observation|> follows it (a turn_end_mismatch
    divergence the worker sees); it is never dropped or replaced."""
    r = renderer()
    history, new, _ = CASES["tool_result"]
    proper = r.continuation([*history, *new], len(history), OBSERVATION_ID, TOOLS, {})
    for stopped in (USER_ID, ENDOFTEXT_ID):
        cont = r.continuation([*history, *new], len(history), stopped, TOOLS, {})
        assert cont == [OBSERVATION_ID, *proper]
    history, new, _ = CASES["user_turn"]
    proper = r.continuation([*history, *new], len(history), USER_ID, TOOLS, {})
    cont = r.continuation([*history, *new], len(history), OBSERVATION_ID, TOOLS, {})
    assert cont == [USER_ID, *proper]


def test_reasoning_the_template_drops_stays_in_the_chain() -> None:
    """After a new user message the template writes <think></think> for the earlier turn; the
    chain holds the sampled reasoning and the continuation is still the full render's tail."""
    r = renderer()
    history = [USER, Message(role="assistant", content="Sure.", reasoning="Easy.")]
    new = [Message(role="user", content="More?")]
    chain = sampled_chain(r, history, USER_ID, {})
    full_text = r.render_text([*history, *new], TOOLS, {}, add_generation_prompt=True)
    full = ids(r, full_text)
    cont = r.continuation([*history, *new], len(history), USER_ID, TOOLS, {})
    assert "Easy." in family_tokenizer("glm45").decode(chain) and "Easy." not in full_text
    assert full[-len(cont) :] == cont
    assert family_tokenizer("glm45").decode(cont) == "\nMore?<|assistant|>"


def test_continuation_cost_does_not_depend_on_history() -> None:
    r = renderer()
    short = [SYSTEM, USER, Message(role="assistant", content="ok")]
    long = [SYSTEM] + [USER, Message(role="assistant", content="ok")] * 100
    new = [Message(role="user", content="next")]
    assert r.continuation([*short, *new], 3, USER_ID, (), {}) == r.continuation(
        [*long, *new], len(long), USER_ID, (), {}
    )
