"""Chat-template rendering, whole or incremental (TITO).

Invariant: for a conversation whose cached token chain ends with an assistant turn, the tokens
returned by :meth:`ChatRenderer.continuation` are exactly what the policy's chat template emits
after that assistant turn's end-of-turn token, so ``chain + continuation`` equals the full render
whenever the chain's tokens equal the template's rendering of the history (tested per family).
When they differ (the model sampled a non-canonical tokenization, the template strips
``<think>`` from history...), the chain keeps the sampled tokens: that is the point of TITO.

The continuation is rendered on a reduced conversation (system message, an anchor user turn,
the assistant turn, the new messages) so its cost depends on the new messages only, never on
the length of the history. Nor on the tool list's, where the family declares that what its
template writes after an assistant turn (wherever that turn is append-only) is the same under
any non-empty list (``Family.tools_stand_in``): the reduced conversation is then rendered under a
one-tool stand-in, so the template neither writes a long list nor is the key of the real one
needed (tests/titoflow/tito/test_tools_stand_in.py proves the declaration for every family on tool
calls and results, and that a template reading the tools after the turn needs the real list).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from titoflow.errors import NotAppendOnly, TemplateError
from titoflow.tito.families import detect_family, resolve_family
from titoflow.tito.families.base import Family
from titoflow.tito.messages import Message, render_key
from titoflow.tito.template import ChatTemplate
from titoflow.tito.tokenizer import TextEncoder

# Stands in for the assistant's content so sampled text never enters the terminator search.
_SENTINEL = "TITO_SENTINEL_4b1d"
_ANCHOR_USER = Message(role="user", content="TITO_ANCHOR")
# Stands in for a non-empty tool list in a continuation (``Family.tools_stand_in``): a well-formed
# tool, so every template writes it as it would any, and takes the branches of a non-empty list.
_STAND_IN_TOOLS: tuple[dict[str, Any], ...] = (
    {
        "type": "function",
        "function": {
            "name": "tito_stand_in",
            "description": "Stands in for the tool list.",
            "parameters": {
                "type": "object",
                "properties": {"value": {"type": "string", "description": "A value."}},
                "required": ["value"],
            },
        },
    },
)
# Distinct (system prompt, tools, template switches) openings kept; a fleet runs a handful.
_OPENINGS_KEPT = 256


class Tokenizer(Protocol):
    """The part of a transformers tokenizer the renderer needs."""

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: Any, skip_special_tokens: bool = ...) -> str: ...

    def convert_tokens_to_ids(self, tokens: str) -> Any: ...

    @property
    def all_special_tokens(self) -> list[str]: ...

    @property
    def chat_template(self) -> Any: ...


class ChatRenderer:
    """The policy's template and its family: ``family`` defaults to the one detected from the
    tokenizer's chat template. ``stop_token_ids`` end a generation (the terminator first);
    a chain whose last token is one of them ends its turn."""

    def __init__(self, tokenizer: Tokenizer, family: Family | None = None) -> None:
        self.tokenizer = tokenizer
        self.family = family or detect_family(template_source(tokenizer))
        self._template = ChatTemplate(tokenizer)
        encoder = TextEncoder(tokenizer)
        self.encode = encoder.__call__
        self.encode_within = encoder.within
        self.min_tokens = encoder.min_tokens
        self.terminator, self.closes_turn = self._detect_terminator()
        self.terminator_id = int(tokenizer.convert_tokens_to_ids(self.terminator))
        extra = [self.token_id(t) for t in self.family.stop_tokens]
        self.stop_token_ids = (self.terminator_id, *(i for i in extra if i is not None))
        self.end_ids = frozenset(self.stop_token_ids)
        self.closers = (self.terminator, *self.family.stop_tokens, *self.family.history_closers)
        self._openings: dict[tuple[tuple[Message, ...], str], str] = {}
        self._variables: dict[str, dict[str, Any]] = {}

    @classmethod
    def for_setting(cls, tokenizer: Tokenizer, model_family: str) -> ChatRenderer:
        """The renderer of ``model_family`` (a family's name, or "auto": detected)."""
        return cls(tokenizer, resolve_family(model_family, template_source(tokenizer)))

    def token_id(self, text: str) -> int | None:
        """The id of ``text`` if the vocabulary has it as one token."""
        ids = self.encode(text)
        return ids[0] if len(ids) == 1 else None

    def _detect_terminator(self) -> tuple[str, bool]:
        """The special token that ends an assistant turn in this template, and whether the turn
        writes it itself (``closes_turn``).

        ``<|im_end|>``, ``<|eot_id|>``...: the first special token the template writes after an
        assistant turn's content. GLM writes nothing there: its turn ends where the next
        message's opener (``<|user|>``, ``<|observation|>``) begins, which is also what the
        model samples to stop. There the terminator is the opener of a following user turn, and
        a continuation starts with the opener of whatever message comes next."""
        assistant = Message(role="assistant", content=_SENTINEL)
        for following in ((), (_ANCHOR_USER,)):
            text = self.render_text(
                [_ANCHOR_USER, assistant, *following], (), {}, add_generation_prompt=False
            )
            found = self._first_special(text[text.index(_SENTINEL) + len(_SENTINEL) :])
            if found is not None:
                return found, not following
        raise TemplateError("the chat template writes no special token after an assistant turn")

    def _first_special(self, text: str) -> str | None:
        """The special token that occurs first in ``text`` (the longest where two start there)."""
        found = [(text.find(t), -len(t), t) for t in self.tokenizer.all_special_tokens if t in text]
        return min(found)[2] if found else None

    def render_text(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        template_kwargs: dict[str, Any],
        add_generation_prompt: bool,
        key: str | None = None,
    ) -> str:
        """The template's text; ``key``: ``render_key(tools, template_kwargs)`` if the caller
        has it (made here otherwise: a long tool list's JSON)."""
        if key is None:
            key = render_key(tools, template_kwargs)
        if tools and self.family.template_variables is not None:
            template_kwargs = {**self._tool_variables(key, tools), **template_kwargs}
        dicts = [
            m.template_dict(self.family.tool_arguments_text, self.family.reasoning_key)
            for m in messages
        ]
        try:
            return self._template.render(
                dicts,
                tools,
                template_kwargs,
                add_generation_prompt,
                key,  # the variables added are a function of the tools, which the key covers
            )
        except Exception as exc:  # jinja raises anything: the template's raise_exception, etc.
            raise TemplateError(f"the chat template rejected the conversation: {exc}") from exc

    def _tool_variables(self, key: str, tools: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """The family's template variables for ``tools``, made once per tool list (Kimi's
        TypeScript declarations of a 64 KB list are not rewritten every turn)."""
        made = self._variables.get(key)
        if made is None:
            assert self.family.template_variables is not None
            if len(self._variables) >= _OPENINGS_KEPT:
                self._variables.clear()
            made = self._variables[key] = self.family.template_variables(tools)
        return made

    def full_prompt(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        template_kwargs: dict[str, Any],
        add_generation_prompt: bool = True,
        budget: int | None = None,
        key: str | None = None,
    ) -> list[int]:
        """The conversation's prompt; with ``budget``, ``TooLong`` instead where its text
        cannot fit in that many tokens (``key`` as for :meth:`render_text`)."""
        text = self.render_text(messages, tools, template_kwargs, add_generation_prompt, key)
        return self.encode_within(text, budget)

    def assistant_opening(self) -> list[int]:
        """Token ids the template writes before what the model generates
        (``<|im_start|>assistant\n``): its generation prompt, or where that is not appended to
        the conversation, the opening of an earlier turn in history."""
        opening = self.render_text([_ANCHOR_USER], (), {}, add_generation_prompt=False)
        prompt = self.render_text([_ANCHOR_USER], (), {}, add_generation_prompt=True)
        if prompt.startswith(opening) and len(prompt) > len(opening):
            header = prompt[len(opening) :]
            opener = self.family.reasoning_opener  # GLM-4.7's prompt opens <think>; history not
            if not self.closes_turn and opener and header.endswith(opener):
                header = header[: -len(opener)]
            # Qwen3.5's ``<think>\n``: with thinking off the prompt writes ``<think>\n\n``, whose
            # newlines are another token; the turn starts after the opener either way.
            elif opener and header.rstrip("\n").endswith(opener):
                header = header.rstrip("\n")
            return self.encode(header)
        stand_in = Message(role="assistant", content=_SENTINEL)
        text = self.render_text(
            [_ANCHOR_USER, stand_in, _ANCHOR_USER, stand_in], (), {}, add_generation_prompt=False
        )
        opening = self.render_text([_ANCHOR_USER], (), {}, add_generation_prompt=False)
        if not text.startswith(opening):
            raise TemplateError("the chat template is not append-only before an assistant turn")
        header = text[len(opening) : text.index(_SENTINEL)]
        return self.encode(header)

    def _opening(
        self,
        head: tuple[Message, ...],
        tools: Sequence[dict[str, Any]],
        template_kwargs: dict[str, Any],
        fresh: bool,
        key: str,
    ) -> str:
        """The text before an assistant turn that follows ``head`` and the anchor user turn.
        Memoized: every turn of every session of an agent re-rendered the same system prompt
        and tools for it (half of the continuation's cost)."""
        text = None if fresh else self._openings.get((head, key))
        if text is None:
            text = self.render_text([*head, _ANCHOR_USER], tools, template_kwargs, False, key)
            if len(self._openings) >= _OPENINGS_KEPT:
                self._openings.clear()
            self._openings[head, key] = text
        return text

    def continuation(
        self,
        messages: Sequence[Message],
        covered: int,
        chain_end: int | bool | None,
        tools: Sequence[dict[str, Any]],
        template_kwargs: dict[str, Any],
        budget: int | None = None,
    ) -> list[int]:
        """Tokens to append to a chain covering ``messages[:covered]`` (ending with an assistant
        turn) so the result is the prompt for all of ``messages`` (``TooLong`` instead
        where they cannot fit in ``budget`` tokens). ``chain_end``: the chain's last token if
        it is one of ``end_ids`` (the model stopped on it), else None; a template that closes
        its own turns needs only whether (True/False), GLM's needs which: its turn ends at the
        next message's opener, which the chain holds if the model sampled that one
        (``<|observation|>`` before tool results); any other chain gets the template's opener
        after its own last token, which it keeps (a length cut, a turn that stopped on
        ``<|user|>`` and is followed by tool results)."""
        assistant = messages[covered - 1]
        if assistant.role != "assistant" or covered >= len(messages):
            raise ValueError("a continuation needs a covered assistant turn and new messages")
        head = (messages[0],) if messages[0].role == "system" and covered > 1 else ()
        # A calling turn's content stays empty: harmony writes it as an analysis message, whose
        # <|end|> would pass for the turn's end.
        content = "" if assistant.tool_calls else _SENTINEL
        stand_in = assistant.model_copy(update={"content": content, "reasoning": None})
        reduced = [*head, _ANCHOR_USER, stand_in, *messages[covered:]]
        if tools and self.family.tools_stand_in:
            # What is kept, the text after the assistant turn, is the same under any non-empty
            # list; the real one (Claude Code's: 64 KB) would be written and keyed every turn.
            tools = _STAND_IN_TOOLS
        key = render_key(tools, template_kwargs)
        text = self.render_text(reduced, tools, template_kwargs, True, key)
        opening = self._opening(head, tools, template_kwargs, False, key)
        if not text.startswith(opening):  # a template that writes e.g. today's date: re-render
            opening = self._opening(head, tools, template_kwargs, True, key)
        if not text.startswith(opening):
            raise NotAppendOnly("the chat template is not append-only before an assistant turn")
        if self.closes_turn:
            # The first token that closes the turn as the template writes it in history: Llama's
            # <|eom_id|> after a built-in tool call, harmony's <|call|> or <|end|>.
            ends = [(text.find(closer, len(opening)), closer) for closer in self.closers]
            found = [(at, closer) for at, closer in ends if at >= 0]
            if not found:
                raise TemplateError("the chat template did not close the assistant turn")
            end_of_turn, closer = min(found)
            held = chain_end is not None and chain_end is not False  # any stop token ended it
        else:
            if isinstance(chain_end, bool):
                raise TypeError("this template's turns end at the next opener: pass the token")
            turn = self.render_text(
                [*head, _ANCHOR_USER, stand_in], tools, template_kwargs, False, key
            )
            if not text.startswith(turn):
                raise NotAppendOnly("the chat template is not append-only after an assistant turn")
            end_of_turn = len(turn)
            closer = self._first_special(text[end_of_turn:]) or ""
            if not closer or not text.startswith(closer, end_of_turn):
                raise TemplateError(
                    "the message after an assistant turn starts with no special token"
                )
            held = chain_end is not None and chain_end == self.token_id(closer)
        tail = text[end_of_turn + len(closer) :]
        closing = [] if held else self.encode(closer)
        within = None if budget is None else budget - len(closing)
        return closing + self.encode_within(tail, within)


def template_source(tokenizer: Tokenizer) -> str | None:
    """The text of the chat template that carries the family's tool format. A tokenizer may
    carry several by name; transformers renders a request with tools with ``tool_use`` where
    there is one, and Hermes 2 Pro/3 ship a plain ChatML ``default`` beside it that writes no
    tool format at all, so ``tool_use`` is the one read, else ``default``."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = (
            template.get("tool_use")
            or template.get("default")
            or next(iter(template.values()), None)
        )
    return template if isinstance(template, str) else None
