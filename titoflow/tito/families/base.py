"""What titoflow knows of one model family: how to recognise its chat template, which special
tokens end a generation, how its generated text carries reasoning and tool calls (the parser),
how to force a well-formed call (the grammar), and where its template is not append-only.

Invariant: a :class:`Family` is plain data and pure functions over text, token lookups and
tool schemas; it knows nothing of HTTP, Kafka or the engine. The ingress parses and constrains
with it, the workers' rebuild and the renderer end turns with it, so every service reads one
definition per family (the registry in :mod:`titoflow.tito.families`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from titoflow.tito.output import OutputParser


def tool_call_id(step_id: str, index: int, prefix: str = "call_") -> str:
    """Deterministic, so a replayed or retried step shows the client the same ids."""
    return prefix + hashlib.sha256(f"{step_id}/{index}".encode()).hexdigest()[:24]


class MalformedCall(ValueError):
    """A tool-call block that does not parse; the message says why."""


def parse_json_object(text: str, not_object: str, where: str = "") -> dict[str, Any]:
    """``text`` as one JSON object, else :class:`MalformedCall`: ``where`` then "invalid JSON"
    with the decoder's position, or ``not_object`` when the JSON is no object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MalformedCall(f"{where}invalid JSON: {exc.msg} at char {exc.pos}") from None
    if not isinstance(value, dict):
        raise MalformedCall(where + not_object)
    return value


@dataclass(frozen=True)
class ParserOptions:
    """What a parser for one turn is told.

    ``parse_tools=False`` (tool_choice "none", or no tools offered) leaves tool-call syntax as
    text; ``reasoning_open`` says the generation prompt already opened a reasoning block, so the
    output starts inside it.
    """

    step_id: str
    id_prefix: str = "call_"
    tools: Sequence[Mapping[str, Any]] = ()
    parse_tools: bool = True
    reasoning_open: bool = False


# (name, JSON schema of the parameters) of one offered function tool.
Function = tuple[str, dict[str, Any] | bool]
# A token's id in the policy's vocabulary, or None if the text is not a single token.
TokenLookup = Callable[[str], int | None]
# The structural-tag element (xgrammar's language) of one tool call among ``functions``.
CallGrammar = Callable[[Sequence[Function], TokenLookup], dict[str, Any]]


@dataclass(frozen=True)
class Grammar:
    """How a family's tool calls are forced by the engine's constrained decoding.

    ``call`` writes one call of any of the selected functions; ``separator`` goes between
    parallel calls, and ``prefix``/``suffix`` (each a list of structural-tag elements) around
    the whole run of calls (a section marker some formats put around their calls).
    ``reasoning_layout``: the text before the reasoning block's opening tag and after its
    closing tag when a forced call may follow reasoning (Qwen3 ``<think>…</think>\n\n``,
    GLM-4.5 ``\n<think>…</think>`` then the call's own newline).
    """

    call: CallGrammar
    separator: str = "\n"
    prefix: Callable[[TokenLookup], list[dict[str, Any]]] = lambda _: []
    suffix: Callable[[TokenLookup], list[dict[str, Any]]] = lambda _: []
    reasoning_layout: tuple[str, str] = ("", "\n\n")


@dataclass(frozen=True)
class Family:
    """One model family's template handling, parser and grammar.

    - ``detect`` reads a chat template's source and says whether it is this family's.
    - ``stop_tokens``: special tokens that end a generation besides the template's terminator
      (the first special token it writes after an assistant turn's content), e.g. Llama's
      ``<|eom_id|>``. A chain that ends with any of them ends its turn.
    - ``decode_special_tokens``: the parser reads text decoded with special tokens kept, because
      the format's markers are special tokens (its parser drops the ones it does not read).
    - ``tool_arguments_text``: the template writes a tool call's arguments as given (string
      concatenation, DeepSeek's), so it is handed their JSON text as the client or the model
      wrote it rather than a mapping.
    - ``reasoning_key``: the message key the template reads reasoning from (gpt-oss's
      ``thinking``); ``history_closers``: tokens besides the stop tokens that close an
      assistant message as the template writes it in history (harmony's ``<|end|>``).
    - ``max_calls_per_turn`` / ``content_with_calls``: what the template can write of one
      assistant turn (Llama 3.1's one call and no text beside it): a turn beyond that is
      refused by the template or loses its text in history. ``later_system``: False where the
      template refuses a system message after the first (Qwen3.5's ``raise_exception``).
    - ``native_call_id``: set when the model writes its calls' ids itself and the template
      renders them back into history (Kimi's ``functions.NAME:IDX``): the parser returns the
      model's ids, and ``native_call_id(name, index)`` is the id of the conversation's
      ``index``-th call (what a history of this family holds).
    - ``reasoning_opener``: text the generation prompt ends with when it opened a reasoning
      block (Qwen3's ``<think>``), or None; ``reasoning_tags``: the block's opening and closing.
    - ``assistant_starts``: tokens after which the template starts an assistant turn without
      its usual opening (Mistral writes none, DeepSeek none after tool results): where the
      workers' rebuild finds the model's turns.
    - ``history``: how the template renders past turns, where that is not what was sampled
      (``""`` when it is append-only); ``divergences``: the divergence classes a worker sees
      for it, documented in docs/models.md. A class ending in ``_moved`` means the template
      re-renders the history once some message follows (a later system message, the tool list
      moved to the last user turn): there the ingress renders the turn in full, a new chain.
    - ``tools_stand_in``: a continuation may render under a one-tool stand-in for the tool list,
      since what the template writes after an assistant turn, wherever the turn is append-only,
      is the same under any non-empty list: it writes the tools before the first assistant turn
      (the system block, gpt-oss's developer message, Llama's first user message) and reads no
      more of them afterwards than whether there are any; Mistral's, before the last user
      message, moves them with every new user turn, which is then not append-only whatever the
      list. tests/titoflow/tito/test_tools_stand_in.py proves it per family on tool calls and
      results, and that a template reading the tools after the turn needs the real list.
    - ``template_variables``: what the model's own tokenizer code passes its template beside a
      non-empty tool list (Kimi K2.5/K2.6's ``tools_ts_str``, the tools as TypeScript
      declarations), a function of the tools alone; the renderer adds it to every render with
      tools, so the prompt is the one that code renders.
    """

    name: str
    summary: str
    detect: Callable[[str], bool]
    parser: Callable[[ParserOptions], OutputParser]
    grammar: Grammar | None = None
    stop_tokens: tuple[str, ...] = ()
    decode_special_tokens: bool = False
    tool_arguments_text: bool = False
    reasoning_key: str = "reasoning_content"
    history_closers: tuple[str, ...] = ()
    max_calls_per_turn: int | None = None
    content_with_calls: bool = True
    later_system: bool = True
    native_call_id: Callable[[str, int], str] | None = None
    reasoning_opener: str | None = None
    reasoning_tags: tuple[str, str] | None = None
    assistant_starts: tuple[str, ...] = ()
    history: str = ""
    divergences: tuple[str, ...] = field(default_factory=tuple)
    tools_stand_in: bool = False
    template_variables: Callable[[Sequence[dict[str, Any]]], dict[str, Any]] | None = None

    def reasoning_open(self, prompt_end: str) -> bool:
        """Whether a prompt ending with ``prompt_end`` (decoded, special tokens kept) leaves the
        model inside a reasoning block."""
        opener = self.reasoning_opener
        return opener is not None and prompt_end.rstrip("\n").endswith(opener)
