"""GLM-5's and GLM-5.1's templates held to the ``renderers`` package's GLM-5 renderers, the judge
(``renderers/glm5.py``: "hard-coded Python mirroring the GLM-5 Jinja chat template", a third
party's mirror, not Z.ai's file, which is in no public repository found), and the ``glm45``
family's corpus proof on both.

GLM-5's template is ``templates/glm47.jinja`` (renderers maps GLM-4.7-Flash and GLM-5 to one
renderer, ``glm-5``); GLM-5.1's is titoflow's own, ``templates/glm51.jinja``: GLM-4.7's with two
edits, the tools written without their ``{"type": "function"}`` wrapper and its
``defer_loading``/``strict`` keys, and an empty ``<think></think>`` in an assistant turn after
the last user message that has no reasoning, thinking on (``GLM51Renderer``). Every prompt of the
family corpus and each whole conversation, thinking on and off, ``clear_thinking`` at its default
(and off where an answer before the last user message has reasoning), and a tool list with those
keys and without the wrapper: the token ids must be equal, no rewrite declared, no refusal. Both
templates are detected as ``glm45``; each departs from the other's renderer (the judge tells them
apart).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest
import renderers
from renderers.glm5 import GLM5Renderer, GLM51Renderer

from cli.dev.tokenizers import template_path, tokenizer_dir
from tests.support.corpus import Conversation, corpus
from tests.support.encoder_judge import Case, cases
from tests.support.families import function_tool
from tests.support.family_corpus import echoed, generated_text, opened_reasoning, output_ids
from tests.support.family_corpus import parse as parse_corpus
from tests.support.family_corpus import turns as corpus_turns
from titoflow.tito.families import FAMILIES, detect_family
from titoflow.tito.families.glm45 import GLM45
from titoflow.tito.messages import Message
from titoflow.tito.render import ChatRenderer
from titoflow.tito.tokenizer import load_tokenizer
from workers.rebuild import Rebuilder

# template file -> the judge's renderer and config class
JUDGES: dict[str, tuple[type[GLM5Renderer], Any]] = {
    "glm47.jinja": (GLM5Renderer, renderers.GLM5RendererConfig),
    "glm51.jinja": (GLM51Renderer, renderers.GLM51RendererConfig),
}


@functools.cache
def renderer(template: str) -> ChatRenderer:
    """The family's (stand-in) tokenizer with ``template`` as its chat template."""
    tokenizer = load_tokenizer(tokenizer_dir("glm45"))
    tokenizer.chat_template = template_path(template).read_text()
    return ChatRenderer(tokenizer)


def tool_keys() -> list[Case]:
    """A tool list with the keys GLM-5.1's template leaves out (``strict``, ``defer_loading``)
    and a tool without the ``{"type": "function"}`` wrapper, in both modes."""
    wrapped = function_tool("run", {"command": {"type": "string"}}, "Run a command.")
    wrapped["function"] = {**wrapped["function"], "strict": True, "defer_loading": False}
    bare = function_tool("ls", {"path": {"type": "string"}})["function"]
    messages = (Message(role="user", content="List it."),)
    return [
        Case(f"tool-keys/{mode}", messages, (wrapped, bare), mode == "thinking")
        for mode in ("chat", "thinking")
    ]


def judge_ids(template: str, judge: str, case: Case, clear: bool = True) -> list[int]:
    """What ``judge``'s renderer writes for ``case`` on ``template``'s tokenizer."""
    renderer_class, config = JUDGES[judge]
    oracle = renderer_class(
        renderer(template).tokenizer,
        config(enable_thinking=case.thinking, clear_thinking=clear),
    )
    dicts = [m.template_dict(False, "reasoning_content") for m in case.messages]
    tools = list(case.tools) or None
    return list(oracle.render_ids(dicts, tools=tools, add_generation_prompt=True))


def history_reasoning(case: Case) -> bool:
    """Whether an answer before the case's last user message has reasoning (what
    ``clear_thinking`` off writes back)."""
    users = [at for at, m in enumerate(case.messages) if m.role == "user"]
    return any(m.reasoning for m in case.messages[: users[-1]]) if users else False


def judged(template: str) -> Iterator[tuple[str, list[int], list[int]]]:
    """(case, titoflow's ids, the judge's ids) for every case, and once more with
    ``clear_thinking`` off where it changes what is written."""
    ours = renderer(template)
    for case in [*cases("glm45"), *tool_keys()]:
        for clear in (True, False) if history_reasoning(case) else (True,):
            variables = {
                "enable_thinking": case.thinking,
                **({} if clear else {"clear_thinking": False}),
            }
            name = f"{case.name}{'' if clear else '/clear_thinking=false'}"
            ours_ids = ours.full_prompt(case.messages, case.tools, variables)
            yield name, ours_ids, judge_ids(template, template, case, clear)


@pytest.mark.parametrize("template", sorted(JUDGES))
def test_the_template_writes_what_the_renderers_glm5_renderer_writes(template: str) -> None:
    compared = 0
    for name, ours, theirs in judged(template):
        assert ours == theirs, (name, renderer(template).tokenizer.decode(ours))
        compared += 1
    print(f"\n{template} vs {JUDGES[template][0].__name__}: {compared} prompts, all equal")
    assert compared > len(cases("glm45"))


def test_each_template_departs_from_the_other_renderer() -> None:
    """The judge tells the two apart: GLM-5.1's renderer writes the tools unwrapped, without
    ``strict`` and ``defer_loading``, GLM-5's as given."""
    case = tool_keys()[1]
    for template, other in (("glm47.jinja", "glm51.jinja"), ("glm51.jinja", "glm47.jinja")):
        ours = renderer(template).full_prompt(case.messages, case.tools, {"enable_thinking": True})
        assert ours == judge_ids(template, template, case)
        assert ours != judge_ids(template, other, case)


def test_glm5_and_glm51_templates_are_glm45s() -> None:
    for template in JUDGES:
        text = template_path(template).read_text()
        assert detect_family(text) is GLM45
        assert [f.name for f in FAMILIES if f.detect(text)] == ["glm45"]
    last = [Message(role="user", content="hi"), Message(role="assistant", content="Hello.")]
    glm51 = renderer("glm51.jinja").render_text(last, (), {}, False)
    assert glm51.endswith("<|assistant|><think></think>Hello.")
    glm5 = renderer("glm47.jinja").render_text(last, (), {}, False)
    assert glm5.endswith("<|assistant|></think>Hello.")


@pytest.mark.parametrize("conversation", corpus(), ids=lambda c: c.name)
@pytest.mark.parametrize("template", sorted(JUDGES))
def test_corpus_on_the_glm5_templates(template: str, conversation: Conversation) -> None:
    """The family's corpus proof on GLM-5's and GLM-5.1's templates: each TITO prompt is the
    full render but for think blocks the template does not write back (``reasoning_dropped``:
    GLM-5's writes a turn without reasoning as ``</think>``, where the chain keeps the model's
    ``<think></think>``; GLM-5.1's does so before the last user message); what it renders as
    the model's turn parses back to that turn and renders to the same tokens; the workers'
    rebuild finds every generated turn. The chain is
    continued at every turn but where GLM-5.1's, thinking on, rewrites the previous answer's
    think block because a user message follows it: there the prompt is rendered in full
    (``think_block_moved``)."""
    ours = renderer(template)
    assert ours.family is GLM45
    tools = conversation.tools
    kwargs = {"enable_thinking": conversation.thinking}
    rebuilder = Rebuilder(ours)
    checked, answered = 0, -1
    for turn in corpus_turns(ours, conversation):
        new = turn.history[answered + 1 :]
        moved = template == "glm51.jinja" and conversation.thinking
        rendered_in_full = answered < 0 or (moved and any(m.role == "user" for m in new))
        assert (turn.tail == len(turn.prompt)) == rendered_in_full, len(turn.history)
        answered = len(turn.history)
        full = ours.full_prompt(turn.history, tools, kwargs)
        if turn.prompt != full:
            assert turn.prompt[-turn.tail :] == full[-turn.tail :]
            decode = ours.tokenizer.decode
            assert decode(full).count("<think>") < decode(turn.prompt).count("<think>")
        assert opened_reasoning(ours, turn.prompt) == conversation.thinking
        text = generated_text(ours, turn.output)
        parsed = parse_corpus(GLM45, text, tools, conversation.thinking)
        assert parsed.parse_error is None, text
        assert [(c.name, c.arguments_value()) for c in parsed.tool_calls] == [
            (c.name, c.arguments_value()) for c in turn.answer.tool_calls
        ], text
        again = echoed(parsed, turn.answer)
        assert output_ids(ours, turn.history, again, tools, kwargs) == turn.output, text
        spans = rebuilder.assistant_spans(turn.prompt + turn.output)
        assert spans and spans[-1][1] == len(turn.prompt) + len(turn.output)
        # The span starts at the assistant opening, before the prompt's <think> or </think>.
        assert len(turn.prompt) - 1 <= spans[-1][0] <= len(turn.prompt)
        checked += 1
    assert checked == sum(m.role == "assistant" for m in conversation.messages)
