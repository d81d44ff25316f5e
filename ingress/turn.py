"""The one internal model every wire format (OpenAI chat, Anthropic, Responses) maps to, and the
white-box token call."""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cached_property
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

Api = Literal["openai.chat", "anthropic.messages", "openai.responses"]
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

    def template_dict(self) -> dict[str, Any]:
        """The message as HF chat templates read it."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.reasoning is not None:
            out["reasoning_content"] = self.reasoning
        if self.tool_calls:
            out["tool_calls"] = [
                call.function_call(parsed_arguments=True) for call in self.tool_calls
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


class SamplingOptions(BaseModel):
    model_config = ConfigDict(frozen=True)

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: int | None = Field(
        None, description="None: not asked; 0: the sampled token's; k: also the top k."
    )


class SessionRef(BaseModel):
    """Who a call belongs to: from the URL path, headers, or body fallbacks."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    instance_id: str | None = None
    turn_id: str | None = None


class ChatTurn(BaseModel):
    """One request to the policy, whatever API it came in through."""

    model_config = ConfigDict(frozen=True)

    session: SessionRef
    api: Api
    model: str
    messages: tuple[Message, ...]
    tools: tuple[dict[str, Any], ...] = Field(
        (), description="OpenAI function-tool schemas, as chat templates take them."
    )
    tool_choice: Literal["auto", "none", "required", "named"] = "auto"
    tool_choice_name: str | None = None
    sampling: SamplingOptions = SamplingOptions()
    template_kwargs: dict[str, Any] = Field(default_factory=dict)

    @cached_property
    def tools_key(self) -> str:
        """Chains continue only under the same tools and template switches: they shape prompts.
        Cached: a turn reads it three times (find, step record, chain advance)."""
        return tools_key(self.tools, self.template_kwargs)


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


class TokenCall(BaseModel):
    """One white-box call: the caller tokenized, the ingress only records and forwards ids."""

    model_config = ConfigDict(frozen=True)

    session: SessionRef
    model: str
    prompt_ids: tuple[int, ...]
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    top_logprobs: int = 0
