"""Chat messages as every wire format maps them and every chat template reads them, and the
keys that decide whether two requests continue one token chain: a message's match key and the
tools key. Pure values: the ingress matches a client's echo against them, and the workers rebuild
prompts from what steps recorded with them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

Matcher = Literal["strict", "tool_call_id"]


class ToolCall(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: str = Field(description="JSON text exactly as the client or the model wrote it.")

    def function_call(self, parsed_arguments: bool) -> dict[str, Any]:
        """The OpenAI-style call: arguments as text (wire) or parsed (chat templates)."""
        arguments = self.arguments_value() if parsed_arguments else self.arguments
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": arguments},
        }

    def arguments_value(self) -> Any:
        """Arguments as the template expects them (a mapping); raw text if not valid JSON."""
        try:
            return json.loads(self.arguments)
        except ValueError:
            return self.arguments


class Message(BaseModel):
    model_config = ConfigDict(frozen=True)

    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None

    def template_dict(
        self, arguments_text: bool = False, reasoning_key: str = "reasoning_content"
    ) -> dict[str, Any]:
        """The message as HF chat templates read it: tool-call arguments as a mapping, or as
        their JSON text for templates that write them as given (``arguments_text``); reasoning
        under the key the template reads (gpt-oss's reads ``thinking``)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.reasoning is not None:
            out[reasoning_key] = self.reasoning
        if self.tool_calls:
            out["tool_calls"] = [
                call.function_call(parsed_arguments=not arguments_text) for call in self.tool_calls
            ]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out

    @classmethod
    def from_template_dict(cls, message: dict[str, Any]) -> Message:
        """The inverse of :meth:`template_dict` (how steps record messages)."""
        calls = tuple(
            ToolCall(
                id=str(call.get("id") or ""),
                name=call["function"]["name"],
                arguments=arguments if isinstance(arguments, str) else json.dumps(arguments),
            )
            for call in message.get("tool_calls") or ()
            for arguments in [call["function"].get("arguments")]
        )
        return cls(
            role=message["role"],
            content=message.get("content") or "",
            reasoning=message.get("reasoning_content"),
            tool_calls=calls,
            tool_call_id=message.get("tool_call_id"),
            name=message.get("name"),
        )

    def match_key(self, matcher: Matcher) -> tuple[Any, ...]:
        """What must be equal for a client's echo of this message to count as the same message.

        Reasoning is left out: clients rarely send it back, and the tokens that carried it are
        already in the chain. ``strict`` compares tool arguments as parsed JSON; ``tool_call_id``
        anchors an assistant turn that called tools on the call ids alone, because Claude Code
        re-serializes arguments and renames tools (Task → Agent) between turns.
        """
        if matcher == "tool_call_id" and self.tool_calls:
            return (self.role, tuple(call.id for call in self.tool_calls))
        calls = tuple(
            (call.id, call.name, json.dumps(call.arguments_value(), sort_keys=True))
            for call in self.tool_calls
        )
        return (self.role, self.content, calls, self.tool_call_id)


_MESSAGES = TypeAdapter(tuple[Message, ...])


def messages_from_fields(fields: list[dict[str, Any]]) -> tuple[Message, ...]:
    """Messages from already-validated wire fields, in one validation pass for the whole history
    (a third of the cost of building each ``Message`` and ``ToolCall`` on its own)."""
    return _MESSAGES.validate_python(fields)


def render_key(tools: Sequence[dict[str, Any]], template_kwargs: dict[str, Any]) -> str:
    """The tools and template switches exactly as a template reads them: JSON in their own key
    order (which ``tojson`` writes), unlike :func:`tools_key`, so two lists that differ only in
    key order render apart; ``1``, ``1.0`` and ``true`` distinct."""
    value = [list(tools), template_kwargs]
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value, default=repr)


def tools_key(tools: Sequence[dict[str, Any]], template_kwargs: dict[str, Any]) -> str:
    """The tools and template switches as canonical JSON (sorted keys; ``1``, ``1.0`` and
    ``true`` distinct; request bodies hold no NaN, see ``http.read_json``). orjson is a tenth of
    the standard library's cost, which grew with every tool schema; that is the fallback for
    what orjson refuses (integers over 64 bits, lone surrogates)."""
    value = [list(tools), template_kwargs]
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return json.dumps(value, sort_keys=True, default=repr)
