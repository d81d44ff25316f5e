"""``Family.tools_stand_in`` proven: for every family that declares it, the continuation rendered
under the one-tool stand-in is token for token the continuation rendered under the real list
(or both refuse the turn alike), on the corpus's conversations and on generated tool lists
(typed parameters) with calls to them, from every assistant turn continued by one and by two
model turns (so the new messages hold tool calls and tool results, which a template could write
from the tool list). A family declaring False must be shown to need it: a template that types a
call's arguments from the tool list (as an XML call format may) continues differently under the
stand-in, and its family declares False."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.harness import claude_code_tools
from cli.dev.tokenizers import tokenizer_dir
from tests.support.corpus import TOOLS, Conversation, corpus, tool
from tests.support.family_corpus import (
    PROVEN,
    in_family_ids,
    renderer_of,
    reordered,
    template_kwargs,
)
from titoflow.errors import NotAppendOnly, TemplateError
from titoflow.tito.families import family_named
from titoflow.tito.messages import Message, ToolCall
from titoflow.tito.render import ChatRenderer
from titoflow.tito.tokenizer import load_tokenizer

CORPUS = corpus()
TOOL_LISTS = (TOOLS, reordered(TOOLS[:2]), claude_code_tools())

Outcome = list[int] | str


def outcome(
    renderer: ChatRenderer,
    messages: tuple[Message, ...],
    covered: int,
    tools: tuple[dict[str, Any], ...],
    kwargs: dict[str, Any],
) -> Outcome:
    """The continuation of a chain covering ``messages[:covered]`` (the model stopped on the
    terminator), or the refusal's kind."""
    try:
        return renderer.continuation(messages, covered, renderer.terminator_id, tools, kwargs)
    except (NotAppendOnly, TemplateError) as exc:
        return type(exc).__name__


def real_list_renderer(renderer: ChatRenderer) -> ChatRenderer:
    """The renderer of the same template whose continuations render the real tool list."""
    family = replace(renderer.family, tools_stand_in=False)
    return ChatRenderer(renderer.tokenizer, family)


def stand_in_renderer(renderer: ChatRenderer) -> ChatRenderer:
    return ChatRenderer(renderer.tokenizer, replace(renderer.family, tools_stand_in=True))


def differences(
    renderer: ChatRenderer,
    messages: tuple[Message, ...],
    tools: tuple[dict[str, Any], ...],
    kwargs: dict[str, Any],
) -> tuple[int, list[int]]:
    """(continuations compared, the covered counts where the stand-in and the real list
    continue apart), continuing each assistant turn by the next one and by the one after."""
    stand_in, real = stand_in_renderer(renderer), real_list_renderer(renderer)
    turns = [at for at, message in enumerate(messages) if message.role == "assistant"]
    compared, apart = 0, []
    for index, at in enumerate(turns):
        for end in turns[index + 1 : index + 3]:
            history = messages[:end]
            ours = outcome(stand_in, history, at + 1, tools, kwargs)
            if ours != outcome(real, history, at + 1, tools, kwargs):
                apart.append(at + 1)
            compared += 1
    return compared, apart


@pytest.mark.parametrize("name", PROVEN)
def test_the_declaration_holds_on_the_corpus(name: str) -> None:
    renderer = renderer_of(name)
    family = renderer.family
    compared, apart = 0, []
    for conversation in CORPUS:
        conversation = in_family_ids(family, conversation)
        kwargs = template_kwargs(family, conversation)
        for tools in TOOL_LISTS if conversation.tools else ((),):
            seen, differ = differences(renderer, conversation.messages, tools, kwargs)
            compared += seen
            apart += differ
    assert compared > 100
    if family.tools_stand_in:
        assert apart == [], f"{name}: the stand-in continues apart after messages {apart}"
    else:
        assert apart, f"{name} declares the real list needed, but the corpus never shows it"


_NAMES = st.from_regex(r"[a-z][a-z_]{0,10}", fullmatch=True)
_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "string": st.text(max_size=12),
    "integer": st.integers(-5, 10**6),
    "number": st.floats(-1e6, 1e6, allow_nan=False),
    "boolean": st.booleans(),
    "array": st.lists(st.integers(0, 9), max_size=3),
    "object": st.dictionaries(st.sampled_from("abc"), st.integers(0, 9), max_size=2),
}


@st.composite
def tool_lists(draw: st.DrawFn) -> tuple[dict[str, Any], ...]:
    names = draw(st.lists(_NAMES, min_size=1, max_size=4, unique=True))
    out = []
    for name in names:
        parameters = draw(st.dictionaries(_NAMES, st.sampled_from(sorted(_VALUES)), max_size=4))
        properties = {p: {"type": kind} for p, kind in parameters.items()}
        required = [p for p in parameters if draw(st.booleans())]
        out.append(tool(name, properties, required))
    return tuple(out)


@st.composite
def agent_loops(draw: st.DrawFn) -> Conversation:
    """A tool loop calling ``tools`` with arguments of their declared types (some omitted),
    tool results, now and then a user turn, a closing answer."""
    tools = draw(tool_lists())
    messages = [
        Message(role="system", content=draw(st.text(min_size=1, max_size=30))),
        Message(role="user", content="Do the task."),
    ]
    calls = 0
    for _ in range(draw(st.integers(2, 5))):
        batch = []
        for chosen in draw(st.lists(st.sampled_from(tools), min_size=1, max_size=2)):
            function = chosen["function"]
            properties = function["parameters"]["properties"]
            arguments = {
                name: draw(_VALUES[spec["type"]])
                for name, spec in properties.items()
                if draw(st.booleans())
            }
            call_id, arguments_text = f"call_{calls}", json.dumps(arguments)
            batch.append(ToolCall(id=call_id, name=function["name"], arguments=arguments_text))
            calls += 1
        content = draw(st.sampled_from(["", "Checking."]))
        messages.append(Message(role="assistant", content=content, tool_calls=tuple(batch)))
        for call in batch:
            messages.append(
                Message(role="tool", content=draw(st.text(max_size=20)), tool_call_id=call.id)
            )
        if draw(st.booleans()):
            messages.append(Message(role="user", content="And then?"))
            messages.append(Message(role="assistant", content="Going on."))
            messages.append(Message(role="user", content="Go on."))
    messages.append(Message(role="assistant", content="Done."))
    return Conversation("generated", tuple(messages), tools, draw(st.booleans()))


@pytest.mark.parametrize("name", [n for n in PROVEN if family_named(n).tools_stand_in])
@settings(max_examples=10, deadline=None)
@given(conversation=agent_loops())
def test_the_declaration_holds_on_generated_tool_lists(
    name: str, conversation: Conversation
) -> None:
    renderer = renderer_of(name)
    family = renderer.family
    conversation = in_family_ids(family, conversation)
    kwargs = template_kwargs(family, conversation)
    compared, apart = differences(renderer, conversation.messages, conversation.tools, kwargs)
    assert compared >= 2
    assert apart == [], f"{name}: the stand-in continues apart after messages {apart}"


# A ChatML template that writes the tool list in its system block and, in every call, each
# argument's type as the tool list declares it: what it writes after an assistant turn reads
# the tools.
TYPED_CALLS = """
{%- if tools or messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{ messages[0].content }}{% endif %}
{%- for tool in tools or [] %}{{ '\\n' + tool.function.name }}{% endfor %}
{{- '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\\n' + message.content }}
{%- for call in message.tool_calls or [] %}
{{- '<tool_call><function=' + call.function.name + '>' }}
{%- for name, value in call.function.arguments | items %}
{%- set ns = namespace(type='any') %}
{%- for tool in tools or [] if tool.function.name == call.function.name %}
{%- if name in tool.function.parameters.properties %}
{%- set ns.type = tool.function.parameters.properties[name].type %}
{%- endif %}
{%- endfor %}
{{- '<parameter=' + name + ' type=' + ns.type + '>' + value | tojson + '</parameter>' }}
{%- endfor %}
{{- '</function></tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}
"""


def test_a_template_that_reads_the_tools_after_the_turn_needs_the_real_list() -> None:
    """Under the stand-in, such a template would type the calls of the new messages wrongly;
    declared False (the default), its continuation renders the real list and is the full
    render's tail."""
    tokenizer = load_tokenizer(tokenizer_dir("qwen3"))  # its own copy: the template replaced
    tokenizer.chat_template = TYPED_CALLS
    family = replace(family_named("qwen3"), name="typed_calls", tools_stand_in=False)
    renderer = ChatRenderer(tokenizer, family)
    assert renderer.terminator == "<|im_end|>"
    conversation = next(c for c in CORPUS if c.name == "parallel-plain")
    compared, apart = differences(renderer, conversation.messages, TOOLS, {})
    assert compared > 5 and apart, "the stand-in continues as the real list does"
    messages, stand_in = conversation.messages, stand_in_renderer(renderer)
    for covered in apart:
        after = [at for at in range(covered, len(messages)) if messages[at].role == "assistant"]
        for end in after[:2]:
            history, full = messages[:end], renderer.full_prompt(messages[:end], TOOLS, {})
            ours = renderer.continuation(history, covered, renderer.terminator_id, TOOLS, {})
            assert full[-len(ours) :] == ours
            wrong = outcome(stand_in, history, covered, TOOLS, {})
            assert wrong == ours or full[-len(wrong) :] != wrong
