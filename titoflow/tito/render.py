"""Chat-template rendering, whole or incremental (TITO).

Invariant: for a conversation whose cached token chain ends with an assistant turn, the tokens
returned by :meth:`ChatRenderer.continuation` are exactly what the policy's chat template emits
after that assistant turn's end-of-turn token, so ``chain + continuation`` equals the full render
whenever the chain's tokens equal the template's rendering of the history (tested per family).
When they differ (the model sampled a non-canonical tokenization, the template strips
``<think>`` from history...), the chain keeps the sampled tokens: that is the point of TITO.

The continuation is rendered on a reduced conversation (system message, an anchor user turn,
the assistant turn, the new messages) so its cost depends on the new messages only, never on
the length of the history.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from titoflow.errors import TemplateError
from titoflow.tito.messages import Message, tools_key
from titoflow.tito.tokenizer import text_encoder

# Stands in for the assistant's content so sampled text never enters the terminator search.
_SENTINEL = "TITO_SENTINEL_4b1d"
_ANCHOR_USER = Message(role="user", content="TITO_ANCHOR")
# Distinct (system prompt, tools, template switches) openings kept; a fleet runs a handful.
_OPENINGS_KEPT = 256


class Tokenizer(Protocol):
    """The part of a transformers tokenizer the renderer needs."""

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def convert_tokens_to_ids(self, tokens: str) -> Any: ...

    @property
    def all_special_tokens(self) -> list[str]: ...


class ChatRenderer:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.encode = text_encoder(tokenizer)
        self.terminator = self._detect_terminator()
        self.terminator_id = int(tokenizer.convert_tokens_to_ids(self.terminator))
        self._openings: dict[tuple[tuple[Message, ...], str], str] = {}

    def _detect_terminator(self) -> str:
        """The special token that closes an assistant turn in this template (``<|im_end|>``,
        ``<|eot_id|>``...): the first special token the template writes after the content."""
        text = self.render_text(
            [_ANCHOR_USER, Message(role="assistant", content=_SENTINEL)],
            tools=(),
            template_kwargs={},
            add_generation_prompt=False,
        )
        tail = text[text.index(_SENTINEL) + len(_SENTINEL) :]
        found = [(tail.find(tok), tok) for tok in self.tokenizer.all_special_tokens if tok in tail]
        if not found:
            raise TemplateError("the chat template writes no special token after an assistant turn")
        return min(found)[1]

    def render_text(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        template_kwargs: dict[str, Any],
        add_generation_prompt: bool,
    ) -> str:
        try:
            text = self.tokenizer.apply_chat_template(
                [m.template_dict() for m in messages],
                tools=list(tools) or None,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **template_kwargs,
            )
        except Exception as exc:  # jinja raises anything: the template's raise_exception, etc.
            raise TemplateError(f"the chat template rejected the conversation: {exc}") from exc
        return str(text)

    def full_prompt(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        template_kwargs: dict[str, Any],
        add_generation_prompt: bool = True,
    ) -> list[int]:
        text = self.render_text(messages, tools, template_kwargs, add_generation_prompt)
        return self.encode(text)

    def assistant_opening(self) -> list[int]:
        """Token ids the template writes before an assistant turn's content in history
        (``<|im_start|>assistant\n``): an earlier turn, since templates decorate the last one
        (Qwen3 adds an empty think block)."""
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
    ) -> str:
        """The text before an assistant turn that follows ``head`` and the anchor user turn.
        Memoized: every turn of every session of an agent re-rendered the same system prompt
        and tools for it (half of the continuation's cost)."""
        key = (head, tools_key(tools, template_kwargs))
        text = None if fresh else self._openings.get(key)
        if text is None:
            text = self.render_text([*head, _ANCHOR_USER], tools, template_kwargs, False)
            if len(self._openings) >= _OPENINGS_KEPT:
                self._openings.clear()
            self._openings[key] = text
        return text

    def continuation(
        self,
        messages: Sequence[Message],
        covered: int,
        chain_ends_with_terminator: bool,
        tools: Sequence[dict[str, Any]],
        template_kwargs: dict[str, Any],
    ) -> list[int]:
        """Tokens to append to a chain covering ``messages[:covered]`` (ending with an assistant
        turn) so the result is the prompt for all of ``messages``."""
        assistant = messages[covered - 1]
        if assistant.role != "assistant" or covered >= len(messages):
            raise ValueError("a continuation needs a covered assistant turn and new messages")
        head = (messages[0],) if messages[0].role == "system" and covered > 1 else ()
        stand_in = assistant.model_copy(update={"content": _SENTINEL, "reasoning": None})
        reduced = [*head, _ANCHOR_USER, stand_in, *messages[covered:]]
        text = self.render_text(reduced, tools, template_kwargs, add_generation_prompt=True)
        opening = self._opening(head, tools, template_kwargs, fresh=False)
        if not text.startswith(opening):  # a template that writes e.g. today's date: re-render
            opening = self._opening(head, tools, template_kwargs, fresh=True)
        if not text.startswith(opening):
            raise TemplateError("the chat template is not append-only before an assistant turn")
        end_of_turn = text.find(self.terminator, len(opening))
        if end_of_turn < 0:
            raise TemplateError("the chat template did not close the assistant turn")
        tail = text[end_of_turn + len(self.terminator) :]
        closing = [] if chain_ends_with_terminator else [self.terminator_id]
        return closing + self.encode(tail)
