"""TITO rendering across chat-template families (invariant: exact tokens, suffix as the template
would emit it after the real prefix)."""

from __future__ import annotations

import json

import pytest

from cli.dev.model_build import tokenizer_source_dir
from cli.dev.tokenizers import SOURCES
from tests.support.families import family_tokenizer, path_tool
from titoflow.tito.families import NAMES
from titoflow.tito.messages import Message, ToolCall
from titoflow.tito.render import ChatRenderer
from titoflow.tito.tokenizer import TextEncoder, load_tokenizer

TOOLS = (path_tool("read_file", "Read a file"),)
FAMILIES = sorted(set(NAMES) & set(SOURCES))


def call(idx: int, path: str) -> ToolCall:
    return ToolCall(id=f"call{idx:05d}", name="read_file", arguments=json.dumps({"path": path}))


SYSTEM = Message(role="system", content="You are a careful agent.")
USER = Message(role="user", content="Summarize  README.md\n\n please.")
# A history ending with an assistant turn, and the scaffold's next message. (Every family's
# continuation over whole conversations: tests/titoflow/tito/test_family_corpus.py.)
HISTORY = [SYSTEM, USER, Message(role="assistant", content="Sure.")]
NEW = [Message(role="user", content="Now  the tests?")]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_length_cut_completion_gets_its_turn_closed(family: str) -> None:
    """A chain cut at max_tokens has no end token: the continuation writes the one the
    template closes the turn with in history (harmony's <|end|>, elsewhere the terminator)."""
    renderer = ChatRenderer(family_tokenizer(family))
    end = renderer.terminator_id  # the model stopped on it (GLM: <|user|> opens the user turn)
    closed = renderer.continuation([*HISTORY, *NEW], len(HISTORY), end, (), {})
    cut = renderer.continuation([*HISTORY, *NEW], len(HISTORY), None, (), {})
    closers = {renderer.encode(closer)[0] for closer in renderer.closers}
    assert cut[1:] == closed and cut[0] in closers


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_continuation_cost_does_not_depend_on_history(family: str) -> None:
    """The continuation is rendered from the new messages only: a long history changes nothing."""
    renderer = ChatRenderer(family_tokenizer(family))
    short = [SYSTEM, USER, Message(role="assistant", content="ok")]
    long = [SYSTEM] + [USER, Message(role="assistant", content="ok")] * 200
    new = [Message(role="user", content="next")]
    end = renderer.terminator_id
    assert renderer.continuation([*short, *new], 3, end, (), {}) == renderer.continuation(
        [*long, *new], len(long), end, (), {}
    )


def test_qwen3_history_rewrite_is_why_tito_exists() -> None:
    """Qwen3's template drops <think> from earlier turns: re-rendering turn 2 would not reproduce
    the tokens the model generated in turn 1, while the TITO prompt keeps them."""
    tokenizer = family_tokenizer("qwen3")
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
def test_TextEncoder_gives_the_ids_transformers_gives(family: str) -> None:
    tokenizer = family_tokenizer(family)
    encode = TextEncoder(tokenizer)
    for text in ENCODED_TEXTS:
        assert encode(text) == tokenizer.encode(text, add_special_tokens=False), text


def test_TextEncoder_leaves_a_backend_with_its_own_truncation_to_transformers() -> None:
    tokenizer = load_tokenizer(tokenizer_source_dir())  # a private copy: it is changed below
    tokenizer.backend_tokenizer.enable_truncation(4)
    text = "a sentence of more than four tokens, surely"
    ids = TextEncoder(tokenizer)(text)  # before transformers' own call turns truncation off
    assert len(ids) > 4
    assert ids == tokenizer.encode(text, add_special_tokens=False)
