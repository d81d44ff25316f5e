"""titoflow's prompts against two independent TITO implementations: the ``renderers`` package
(prime-rl's hand-written renderers) and ``miles-tito-tokenizers`` (miles' template-driven TITO).

For every family both cover, each conversation of the shared corpus (tests/support/corpus.py)
goes turn by turn through titoflow and the oracle, and their token ids are compared twice per turn:

- prompt: the turn's prompt rendered in full (titoflow's ``full_prompt``; the oracle's render
  with the generation prompt);
- TITO: the turn's prompt built by extension, the previous turn's prompt and output (the same
  tokens for both) followed by what the new messages add (titoflow's chain, as
  tests/support/family_corpus.py builds it; ``bridge_to_next_turn`` / ``merge_tokens``).

Invariant: the ids are equal, or the difference is one the pair declares below, each a text
rewrite that turns titoflow's decoded prompt into the oracle's exactly (or a refusal the oracle
raises, matched by its message), with the reason the oracle departs from the family's template.
Where a full prompt differs, titoflow's is the template's own render
(``tokenizer.apply_chat_template``, the judge). A declaration that no turn needs fails the test.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import renderers
from miles_tito_tokenizers import get_tito_tokenizer

from cli.dev.tokenizers import template_path, tokenizer_dir
from tests.support.corpus import Conversation
from tests.support.family_corpus import (
    CORPUS,
    in_family_ids,
    renderer_of,
    template_kwargs,
    turns,
)
from titoflow.tito.messages import Message
from titoflow.tito.render import ChatRenderer
from titoflow.tito.tokenizer import load_tokenizer

# renderers' gpt-oss renderer reads the o200k_harmony ranks through openai-harmony: the family's
# tokenizer directory holds them, so nothing is downloaded.
os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(tokenizer_dir("gpt_oss"))


@dataclass(frozen=True)
class Seen:
    """One comparison that differed: ``kind`` "prompt" or "tito"; the two prompts decoded (a
    TITO prompt from where it leaves the previous prompt and output, which both keep);
    ``theirs`` None where the oracle refused, with ``error`` its message."""

    kind: str
    ours: str
    theirs: str | None
    error: str = ""


@dataclass(frozen=True)
class Difference:
    """A way the oracle departs from the template, for ``reason``: ``change`` rewrites
    titoflow's text of a ``kinds`` comparison into the oracle's (a pair's changes compose), or,
    given ``refused``, the oracle raises a message holding it."""

    name: str
    reason: str
    kinds: tuple[str, ...] = ("prompt", "tito")
    change: Callable[[str], str] = lambda text: text
    refused: str = ""


def explained(differences: tuple[Difference, ...], seen: Seen) -> list[str]:
    """The names of the declared differences that make up ``seen`` ([] where they do not)."""
    if seen.theirs is None:
        refusals = [d for d in differences if d.refused and seen.kind in d.kinds]
        return [d.name for d in refusals if d.refused in seen.error][:1]
    text, used = seen.ours, []
    for difference in differences:
        if seen.kind in difference.kinds and not difference.refused:
            changed = difference.change(text)
            if changed != text:
                text = changed
                used.append(difference.name)
    return used if text == seen.theirs else []


# What renders a message list for an oracle: a renderer (renderers) or a TITO tokenizer (miles),
# given the pair's key (its template where it names one, else its family).
Build = Callable[[ChatRenderer, Conversation, str], Any]
Dicts = list[dict[str, Any]]


@dataclass(frozen=True)
class Oracle:
    name: str
    build: Build
    prompt: Callable[[Any, Dicts, Any], list[int]]
    # (oracle, messages before, messages now, the previous prompt, its output, tools) -> the
    # prompt, None where it declines to extend
    extend: Callable[[Any, Dicts, Dicts, list[int], list[int], Any], list[int] | None]
    dicts: Callable[[ChatRenderer, Message], dict[str, Any]]


@dataclass(frozen=True)
class Pair:
    oracle: Oracle
    family: str
    differences: tuple[Difference, ...] = ()
    # Another template of the family than its directory's (cli/dev/tokenizers/templates/NAME.jinja)
    template: str = ""

    @property
    def key(self) -> str:
        return self.template or self.family


# --- renderers ---------------------------------------------------------------------------------

RENDERER_CONFIGS: dict[str, Callable[[dict[str, Any]], Any]] = {
    # thinking_retention "all": bridge across user turns too, as titoflow's chain does (the
    # default re-renders there, dropping what the model generated).
    "qwen3": lambda kw: renderers.Qwen3RendererConfig(
        enable_thinking=kw.get("enable_thinking", True), thinking_retention="all"
    ),
    "glm45": lambda kw: renderers.GLM45RendererConfig(
        enable_thinking=kw.get("enable_thinking", True), thinking_retention="all"
    ),
    "kimi_k2": lambda kw: renderers.KimiK2RendererConfig(thinking_retention="all"),
    "llama3": lambda kw: renderers.Llama3RendererConfig(thinking_retention="all"),
    "gpt_oss": lambda kw: renderers.GptOssRendererConfig(thinking_retention="all"),
    "qwen35": lambda kw: renderers.Qwen35RendererConfig(
        enable_thinking=kw.get("enable_thinking", True), thinking_retention="all"
    ),
    "gemma4": lambda kw: renderers.Gemma4RendererConfig(
        enable_thinking=kw.get("enable_thinking", False)
    ),
    # The reasoning effort titoflow's template (and vLLM's deepseek_v4 mode) takes in thinking
    # mode when the request names none.
    "deepseek_v4": lambda kw: renderers.DeepSeekV4RendererConfig(
        enable_thinking=kw.get("enable_thinking", False), reasoning_effort="high"
    ),
    # Nano's template (Nano and Super share renderers' "nemotron-3"; Ultra's and 3.5's glue
    # </think> otherwise).
    "nemotron3": lambda kw: renderers.Nemotron3RendererConfig(
        enable_thinking=kw.get("enable_thinking", True), thinking_retention="all"
    ),
    # GLM-4.7's template is GLM-5's (renderers' glm-5 renders GLM-4.7-Flash and GLM-5); GLM-5.1's
    # is titoflow's (tests/titoflow/tito/test_template_glm5.py). GLM-5.1's at renderers' default
    # retention (what clear_thinking implies): its template rewrites the last answer's think block
    # at a user query, and so renderers re-renders there.
    "glm47": lambda kw: renderers.GLM5RendererConfig(
        enable_thinking=kw.get("enable_thinking", True), thinking_retention="all"
    ),
    "glm51": lambda kw: renderers.GLM51RendererConfig(
        enable_thinking=kw.get("enable_thinking", True)
    ),
    # MiniMax-M2's default system prompt (renderers' default is M2.5's).
    "minimax_m2": lambda kw: renderers.MiniMaxM2RendererConfig(
        model_identity="You are a helpful assistant.", thinking_retention="all"
    ),
}


def _renderer(renderer: ChatRenderer, conversation: Conversation, key: str) -> Any:
    kwargs = template_kwargs(renderer.family, conversation)
    config = RENDERER_CONFIGS[key](kwargs)
    return renderers.create_renderer(renderer.tokenizer, config)


def _bridge(
    oracle: Any, before: Dicts, now: Dicts, prompt: list[int], output: list[int], tools: Any
) -> list[int] | None:
    bridged = oracle.bridge_to_next_turn(prompt, output, now[len(before) :], tools=tools)
    return None if bridged is None else list(bridged.token_ids)


RENDERERS = Oracle(
    "renderers",
    _renderer,
    lambda o, dicts, tools: list(o.render_ids(dicts, tools=tools, add_generation_prompt=True)),
    _bridge,
    # renderers reads reasoning as reasoning_content and arguments as a mapping or JSON text.
    lambda renderer, message: message.template_dict(False, "reasoning_content"),
)

# --- miles-tito-tokenizers ---------------------------------------------------------------------

# titoflow family -> miles' TITO tokenizer class for the family's format (its template-generic
# "default" is no family's: its dummy messages break DeepSeek's, Llama's and gpt-oss's templates).
# Qwen3.5's is Qwen3-Coder's format and boundary; GLM-4.7's and Kimi K2.5's keep GLM-4.5's and
# K2's turn boundaries. DeepSeek V3.2's renders with SGLang's copy of DeepSeek's encoder, not the
# template.
MILES_TYPES = {
    "qwen3": "qwen3",
    "qwen3_coder": "qwen35",
    "qwen35": "qwen35",
    "glm45": "glm47",
    "kimi_k2": "kimi25",
    "deepseek_v32": "deepseekv32",
    "nemotron3": "nemotron3",
}


# Where miles ships its own fix of the family's template (its SUPPORTED_TEMPLATES rows name it,
# and miles' users install it as the policy's template): Qwen3.5's raises "No user query found"
# on the message lists miles renders to find what new messages add, and miles' copy drops that
# check. It adds a ``clear_thinking`` switch, which miles' row for user appends turns off
# (every past think block kept); on, as here, the text is the original template's.
MILES_FIXED = {"qwen35": "qwen3.5_fixed.jinja"}

# Template switches held at the template's default where miles' rows change them: its Nemotron 3
# rows for user and system appends turn truncate_history_thinking off, keeping every past
# reasoning block in a full render, which the template's default drops before the last user
# message (miles appends the same tokens either way: it renders only the new messages).
MILES_TEMPLATE_DEFAULTS = {"nemotron3": {"truncate_history_thinking": True}}


@functools.cache
def miles_tokenizer(family: str) -> Any:
    """The family's tokenizer with miles' fixed template."""
    tokenizer = load_tokenizer(tokenizer_dir(family))
    fixed = resources.files("miles_tito_tokenizers") / "templates" / MILES_FIXED[family]
    tokenizer.chat_template = fixed.read_text()
    return tokenizer


# Families miles renders with a model's own encoder, which it picks by the ``model_type`` of the
# checkpoint's config.json beside the tokenizer (a tokenizer directory has none: miles would
# render with the template).
MILES_ENCODED = {"deepseek_v32": "deepseek_v32"}
_checkpoints = tempfile.TemporaryDirectory(prefix="miles-checkpoints-")


@functools.cache
def miles_encoded_tokenizer(family: str) -> Any:
    """The family's tokenizer loaded from a copy of its directory with a config.json naming the
    model type miles renders with the encoder for."""
    checkpoint = Path(_checkpoints.name) / family
    shutil.copytree(tokenizer_dir(family), checkpoint)
    (checkpoint / "config.json").write_text(json.dumps({"model_type": MILES_ENCODED[family]}))
    return load_tokenizer(checkpoint)


def _miles(renderer: ChatRenderer, conversation: Conversation, key: str) -> Any:
    kwargs = template_kwargs(renderer.family, conversation)
    name = renderer.family.name
    kind = MILES_TYPES[name]
    tokenizer = renderer.tokenizer
    kwargs = {**kwargs, **MILES_TEMPLATE_DEFAULTS.get(name, {})}
    if name in MILES_FIXED:
        tokenizer, kwargs = miles_tokenizer(name), {**kwargs, "clear_thinking": True}
    if name in MILES_ENCODED:
        tokenizer = miles_encoded_tokenizer(name)
    # The most roles miles supports appending for the family (it refuses the rest).
    for roles in (["tool", "user", "system"], ["tool", "user"], ["tool"]):
        try:
            return get_tito_tokenizer(
                tokenizer, kind, chat_template_kwargs=kwargs, allowed_append_roles=roles
            )
        except ValueError:
            continue
    raise AssertionError(f"miles supports no appends for {kind}")


MILES = Oracle(
    "miles",
    _miles,
    lambda o, dicts, tools: list(
        o.render_messages(dicts, add_generation_prompt=True, tools=tools, tokenize=True)
    ),
    lambda o, before, now, prompt, output, tools: list(
        o.merge_tokens(before, now, prompt + output, tools)
    ),
    # miles renders with the family's template: the messages as titoflow hands them to it.
    lambda renderer, message: message.template_dict(
        renderer.family.tool_arguments_text, renderer.family.reasoning_key
    ),
)

QWEN_OPEN = "<|im_start|>assistant\n"
TOOL_DECLARE = re.compile(r"(<\|im_system\|>tool_declare<\|im_middle\|>)(.*?)(<\|im_end\|>)")
# The corpus's later system message and the user turn before it (tests/support/corpus.py).
LATER_SYSTEM = "Reminder: the user is waiting."
LATER_SYSTEM_AFTER = "<|start|>user<|message|>Status?<|end|>"
RESULT = re.compile(
    r'(to=assistant<\|channel\|>commentary<\|message\|>)("(?:[^"\\]|\\.)*")(<\|end\|>)'
)


def empty_think_kept(text: str) -> str:
    """Qwen text with an empty think block in every assistant turn that has none."""
    return re.sub(re.escape(QWEN_OPEN) + "(?!<think>)", QWEN_OPEN + "<think>\n\n</think>\n\n", text)


def glm_calls_joined(text: str) -> str:
    """GLM text with the newline between two calls dropped in turns that have text beside them."""
    turns = text.split("<|assistant|>")
    for at, turn in enumerate(turns):
        before_calls = turn.split("<tool_call>")[0].split("</think>")[-1]
        if before_calls.strip():
            turns[at] = turn.replace("</tool_call>\n<tool_call>", "</tool_call><tool_call>")
    return "<|assistant|>".join(turns)


DEEPSEEK_BOS = "<｜begin▁of▁sentence｜>"
DEEPSEEK_TOOLS_FIRST = re.compile(
    re.escape(DEEPSEEK_BOS) + r"\n\n(## Tools\n.*?</functions>\n)(.*?)(?=<｜User｜>)", re.S
)
DEEPSEEK_LATER_SYSTEM_AFTER = re.compile(r"<｜User｜>Status\?<｜Assistant｜></?think>")


def deepseek_tools_after_system(text: str) -> str:
    """DeepSeek V3.2 text with the tool block moved after the system prompt it precedes."""
    return DEEPSEEK_TOOLS_FIRST.sub(lambda m: DEEPSEEK_BOS + m[2] + "\n\n" + m[1], text, count=1)


def deepseek_system_unopened(text: str) -> str:
    """DeepSeek V4 text without the assistant opening after the later system message."""
    return re.sub(re.escape(LATER_SYSTEM) + "<｜Assistant｜></?think>", LATER_SYSTEM, text)


MILES_NO_SYSTEM = Difference(
    "system_append_refused",
    "miles registers no fixed template for appending a system message to this family "
    "(SUPPORTED_TEMPLATES rows allow tool and user): merge_tokens raises; the family's template "
    "writes a later system message in place, and titoflow continues the chain",
    kinds=("tito",),
    refused="has role='system', allowed=['tool', 'user']",
)

PAIRS = [
    Pair(
        RENDERERS,
        "qwen3",
        (
            Difference(
                "empty_think_kept",
                "with enable_thinking off, renderers writes the empty <think></think> the "
                "generation prompt opened into every past assistant turn (its documented choice); "
                "Qwen3's template writes a think block only after the last user query and only "
                "with reasoning (`{%- if loop.last or (not loop.last and reasoning_content) %}`)",
                kinds=("prompt",),
                change=empty_think_kept,
            ),
        ),
    ),
    Pair(
        RENDERERS,
        "glm45",
        (
            Difference(
                "calls_joined",
                "renderers writes the newline before a call only when the turn has no text, so a "
                "turn with text and parallel calls reads </tool_call><tool_call>; GLM-4.5's "
                "template opens every call on a new line (`{{ '\\n<tool_call>' + tc.name }}`)",
                change=glm_calls_joined,
            ),
        ),
    ),
    Pair(RENDERERS, "glm45", template="glm47"),
    Pair(
        RENDERERS,
        "glm45",
        (
            Difference(
                "bridge_declined",
                "with thinking on, renderers' GLM-5.1 bridge re-renders at a user query (the "
                "tool_cycle retention its clear_thinking implies: it calls GLM-5.1 with thinking "
                "on not prefix-stable, the template rewriting the previous answer's think "
                "block); titoflow renders that prompt in full too (think_block_moved)",
                kinds=("tito",),
                refused="declined to extend",
            ),
        ),
        template="glm51",
    ),
    Pair(
        RENDERERS,
        "kimi_k2",
        (
            Difference(
                "k2_instruct_template",
                "renderers' kimi-k2 renders K2-Instruct's template: a newline after the default "
                "system prompt, and answers without K2-Thinking's think block, reasoning dropped "
                "(`<think>{{rc}}</think>{{render_content(message)}}`; `<think></think>` in "
                "history)",
                kinds=("prompt",),
                change=lambda t: re.sub(
                    "<think>.*?</think>",
                    "",
                    t.replace("Moonshot AI.<|im_end|>", "Moonshot AI.<|im_end|>\n"),
                    flags=re.S,
                ),
            ),
            Difference(
                "tools_sorted_compact",
                "renderers writes the tool list as Kimi's own tokenizer code does, keys sorted "
                "and compact; the template writes `tools | tojson()` as given (titoflow renders "
                "the template; issue 37 tracks matching Kimi's tokenizer code)",
                kinds=("prompt",),
                change=lambda t: TOOL_DECLARE.sub(
                    lambda m: (
                        m[1]
                        + json.dumps(json.loads(m[2]), sort_keys=True, separators=(",", ":"))
                        + m[3]
                    ),
                    t,
                ),
            ),
        ),
    ),
    Pair(RENDERERS, "llama3"),
    Pair(
        RENDERERS,
        "nemotron3",
        (
            Difference(
                "later_system_refused",
                "renderers' nemotron-3 renders a system message only as the first message and "
                "raises for a later one; Nemotron 3's template writes it in place as a system "
                'turn (`message.role == "user" or message.role == "system"`), and so does '
                "renderers' bridge when it extends a chain with one",
                kinds=("prompt",),
                refused="System message must be at the beginning",
            ),
        ),
    ),
    Pair(
        RENDERERS,
        "gemma4",
        (
            Difference(
                "bridge_declined",
                "renderers' gemma4 bridge extends a turn that ended asking for tool results "
                "(`<|tool_response>`) with those results alone, and with thinking on re-renders "
                "at a user query (its tool_cycle retention, which enable_thinking implies): it "
                "declines results followed by a user turn in one step and a user turn after a "
                "thinking answer; the template writes both after the chain as it stands (the "
                "model turn closed with `<turn|>`), and titoflow continues it",
                kinds=("tito",),
                refused="declined to extend",
            ),
        ),
    ),
    Pair(
        RENDERERS,
        "qwen35",
        (
            Difference(
                "empty_think_kept",
                "with enable_thinking off, renderers writes the empty <think></think> the "
                "generation prompt opened into every past assistant turn (its documented choice); "
                "Qwen3.5's template writes a think block only after the last user query "
                "(`{%- if loop.index0 > ns.last_query_index %}`)",
                kinds=("prompt",),
                change=empty_think_kept,
            ),
        ),
    ),
    Pair(
        RENDERERS,
        "minimax_m2",
        (
            Difference(
                "call_end_unspaced",
                "renderers mirrors MiniMax's own template, which writes `[e~[` right after a "
                "turn's calls (`{{- toolcall_end_token}}` then `{%- set ...`); the vendored "
                "Unsloth copy has a comment line between the two whose line end renders as "
                "`\\n` (`{# Fix by ochafik ... #}`)",
                change=lambda t: t.replace(
                    "</minimax:tool_call>\n[e~[", "</minimax:tool_call>[e~["
                ),
            ),
            Difference(
                "later_system_written",
                "renderers' bridge writes a system message after the first as a `]~b]system` "
                "turn; MiniMax's template renders only the first message as the system prompt "
                "and has no branch for a later one, which it writes nowhere",
                kinds=("tito",),
                change=lambda t: t.replace(
                    "]~b]user\nStatus?[e~[\n",
                    f"]~b]user\nStatus?[e~[\n]~b]system\n{LATER_SYSTEM}[e~[\n",
                ),
            ),
        ),
    ),
    Pair(
        RENDERERS,
        "gpt_oss",
        (
            Difference(
                "schema_by_harmony",
                "renderers writes the tool list with openai-harmony, which renders an object "
                "without properties as `{\\n    }` and a function without parameters as "
                "`(_: {\\n}) => any`; gpt-oss's template writes `object` "
                '(`{{- "object" }}`) and `() => any` (`{{- "() => any;\\n\\n" }}`)',
                kinds=("prompt",),
                change=lambda t: (
                    t.replace("object[]", "{\n    }[]")
                    .replace(": object,", ": {\n    },")
                    .replace("= () => any;", "= (_: {\n}) => any;")
                ),
            ),
            Difference(
                "call_channel_bare",
                "renderers writes a call on `<|channel|>commentary`; the template adds the "
                'content type (`"<|channel|>commentary json<|message|>"`)',
                change=lambda t: t.replace(
                    "<|channel|>commentary json<|message|>", "<|channel|>commentary<|message|>"
                ),
            ),
            Difference(
                "later_system_written",
                "renderers writes a system message after the first as a developer message; "
                "gpt-oss's template writes only the first (`{%- if messages[0].role == "
                '"developer" or messages[0].role == "system" %}`), later ones nowhere',
                change=lambda t: t.replace(
                    LATER_SYSTEM_AFTER,
                    LATER_SYSTEM_AFTER
                    + f"<|start|>developer<|message|># Instructions\n\n{LATER_SYSTEM}<|end|>",
                ),
            ),
            Difference(
                "result_not_json",
                "renderers writes a tool result's text as it is; the template writes it as a "
                "JSON string (`message.content|tojson`)",
                change=lambda t: RESULT.sub(lambda m: m[1] + json.loads(m[2]) + m[3], t),
            ),
            Difference(
                "result_author_unknown",
                "renderers names a tool result's author from the message's `name`, which an "
                "OpenAI tool result does not carry, so it writes `functions.unknown`; the "
                'template names the call\'s function (`"<|start|>functions." + '
                "last_tool_call.name`)",
                change=lambda t: re.sub(
                    r"<\|start\|>functions\.\w+ to=assistant",
                    "<|start|>functions.unknown to=assistant",
                    t,
                ),
            ),
            Difference(
                "analysis_prefilled",
                "renderers' generation prompt opens the analysis channel "
                "(<|channel|>analysis<|message|>); gpt-oss's template ends it at "
                "`<|start|>assistant` and the model writes the channel",
                change=lambda t: (
                    t + "<|channel|>analysis<|message|>" if t.endswith("<|start|>assistant") else t
                ),
            ),
        ),
    ),
    Pair(
        RENDERERS,
        "deepseek_v4",
        (
            Difference(
                "system_unopened",
                "renderers writes no assistant opening after a system message that ends the "
                "conversation or that the model's turn follows; DeepSeek's encoder, as vLLM's "
                "deepseek_v4 mode runs it (the template's judge), opens the model's turn there "
                "(<｜Assistant｜> and </think> or <think>) as after a user turn",
                kinds=("prompt",),
                change=deepseek_system_unopened,
            ),
            Difference(
                "bridge_declined",
                "renderers' deepseek_v4 bridge declines new messages holding more than one tool "
                "result (it sorts results by the calls they answer only in a full render) and, "
                "with thinking on, a user query (its tool_cycle retention); the template writes "
                "both after the chain as it stands, and titoflow continues it",
                kinds=("tito",),
                refused="declined to extend",
            ),
        ),
    ),
    Pair(MILES, "qwen3", (MILES_NO_SYSTEM,)),
    Pair(MILES, "qwen3_coder", (MILES_NO_SYSTEM,)),
    Pair(MILES, "qwen35"),
    Pair(MILES, "glm45"),
    Pair(MILES, "nemotron3"),
    Pair(MILES, "kimi_k2", (MILES_NO_SYSTEM,)),
    Pair(
        MILES,
        "deepseek_v32",
        (
            Difference(
                "tools_in_system_prompt",
                "miles hands DeepSeek's encoder the tools inside the conversation's own system "
                "message (`_inject_tools_into_system`, as SGLang does), written after its "
                "content: the system prompt, a blank line, the tools; vLLM inserts them as a "
                "system message of their own before it (`messages.insert(0, {'role': "
                "'system'})`), which the template writes as vLLM's encoder does: a blank line, "
                "the tools, a newline, then the system prompt",
                kinds=("prompt",),
                change=deepseek_tools_after_system,
            ),
            Difference(
                "later_system_written",
                "miles renders with DeepSeek's encoder, which writes a system message after "
                "the first in place, its content with no header; llama.cpp's port writes it "
                "nowhere (no branch of its loop takes it)",
                kinds=("prompt",),
                change=lambda t: DEEPSEEK_LATER_SYSTEM_AFTER.sub(lambda m: m[0] + LATER_SYSTEM, t),
            ),
            Difference(
                "user_append_refused",
                "miles' DeepSeek V3.2 class registers a row for tool appends only "
                "(SUPPORTED_TEMPLATES): merge_tokens raises for a user message; the template "
                "writes the user turn after the chain, and titoflow continues it (in thinking "
                "mode, where the new turn rewrites the previous user turn's <think>, it renders "
                "the prompt in full: thinking_opener_moved)",
                kinds=("tito",),
                refused="has role='user', allowed=['tool']",
            ),
        ),
    ),
]


# --- the comparison ----------------------------------------------------------------------------


@dataclass
class Tally:
    counts: Counter[str] = field(default_factory=Counter)
    used: Counter[str] = field(default_factory=Counter)
    undeclared: list[str] = field(default_factory=list)


@functools.cache
def pair_renderer(pair: Pair) -> ChatRenderer:
    """The family's renderer, with the pair's template where it names one."""
    if not pair.template:
        return renderer_of(pair.family)
    tokenizer = load_tokenizer(tokenizer_dir(pair.family))
    tokenizer.chat_template = template_path(f"{pair.template}.jinja").read_text()
    renderer = ChatRenderer(tokenizer)
    assert renderer.family.name == pair.family, "detection picks the family of its template"
    return renderer


def judge(renderer: ChatRenderer, dicts: Dicts, conversation: Conversation) -> list[int]:
    """The template's own render of the prompt, through transformers."""
    text = renderer.tokenizer.apply_chat_template(
        dicts,
        tools=list(conversation.tools) or None,
        add_generation_prompt=True,
        tokenize=False,
        **template_kwargs(renderer.family, conversation),
    )
    return list(renderer.tokenizer.encode(text, add_special_tokens=False))


def attempt(render: Callable[[], list[int] | None]) -> tuple[list[int] | None, str]:
    """The oracle's ids, or None and why: its own refusal (compared by its message) or its
    declining to extend."""
    try:
        ids = render()
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"
    return ids, "" if ids is not None else "declined to extend"


def comparisons(
    pair: Pair, renderer: ChatRenderer, conversation: Conversation
) -> Iterator[tuple[str, list[int], list[int] | None, str, Dicts, list[int]]]:
    """(kind, titoflow's ids, the oracle's or None, its refusal, the messages, the previous
    prompt and output a TITO prompt extends) per comparison."""
    conversation = in_family_ids(renderer.family, conversation)
    oracle = pair.oracle.build(renderer, conversation, pair.key)
    tools = list(conversation.tools) or None
    kwargs = template_kwargs(renderer.family, conversation)
    previous: tuple[list[int], list[int], Dicts] | None = None
    for turn in turns(renderer, conversation):
        dicts = [pair.oracle.dicts(renderer, m) for m in turn.history]
        full = renderer.full_prompt(turn.history, conversation.tools, kwargs)
        theirs, error = attempt(functools.partial(pair.oracle.prompt, oracle, dicts, tools))
        yield "prompt", full, theirs, error, dicts, []
        if previous is not None:
            prompt, output, before = previous
            extend = pair.oracle.extend
            theirs, error = attempt(
                functools.partial(extend, oracle, before, dicts, prompt, output, tools)
            )
            yield "tito", turn.prompt, theirs, error, dicts, prompt + output
        answer = pair.oracle.dicts(renderer, turn.answer)
        previous = (turn.prompt, turn.output, [*dicts, answer])


def compare(pair: Pair, perturb: Callable[[list[int]], list[int]] | None = None) -> Tally:
    renderer = pair_renderer(pair)
    decode = renderer.tokenizer.decode
    tally = Tally()
    for conversation in CORPUS:
        for kind, ours, theirs, error, dicts, kept_ids in comparisons(pair, renderer, conversation):
            if perturb is not None:
                ours = perturb(ours)
            tally.counts[kind] += 1
            if ours == theirs:
                tally.counts[f"{kind} equal"] += 1
                continue
            # A TITO prompt from where it leaves what both keep.
            kept = len(kept_ids) if kind == "tito" and ours[: len(kept_ids)] == kept_ids else 0
            seen = Seen(
                kind,
                decode(ours[kept:]),
                None if theirs is None else decode(theirs[kept:]),
                error,
            )
            if theirs is not None and theirs[:kept] != ours[:kept]:
                seen = replace(seen, ours=decode(ours), theirs=decode(theirs))
            names = explained(pair.differences, seen)
            if not names:
                tally.undeclared.append(f"{conversation.name} turn {len(dicts)}: {seen}")
                continue
            if kind == "prompt":  # the oracle departs from the template, not titoflow
                assert ours == judge(renderer, dicts, conversation), names
            tally.counts[f"{kind} declared"] += 1
            tally.used.update(names)
    return tally


@pytest.mark.parametrize(
    "pair", PAIRS, ids=lambda p: "-".join(filter(None, (p.oracle.name, p.family, p.template)))
)
def test_prompts_equal_the_oracles_or_the_difference_is_declared(pair: Pair) -> None:
    tally = compare(pair)
    counts = tally.counts
    print(
        f"{pair.oracle.name}/{pair.family}: {len(CORPUS)} conversations; "
        + "; ".join(
            f"{kind} {counts[kind]} compared, {counts[kind + ' equal']} equal, "
            f"{counts[kind + ' declared']} declared"
            for kind in ("prompt", "tito")
        )
        + f"; {dict(tally.used)}"
    )
    assert not tally.undeclared, "\n".join(tally.undeclared[:6])
    assert counts["prompt"] and counts["tito"]
    stale = [d.name for d in pair.differences if not tally.used[d.name]]
    assert not stale, f"declared differences no turn shows: {stale}"


@pytest.mark.parametrize("family", ["llama3", "qwen3"])
def test_a_changed_token_is_caught(family: str) -> None:
    """One token of titoflow's prompts changed (the last, as an off-by-one turn end would) is a
    difference no declaration explains, for a pair that agrees everywhere and one that declares
    differences."""
    pair = next(p for p in PAIRS if p.oracle is RENDERERS and p.family == family)
    tally = compare(pair, perturb=lambda ids: [*ids[:-1], ids[-1] + 1])
    assert len(tally.undeclared) == tally.counts["prompt"] + tally.counts["tito"]
