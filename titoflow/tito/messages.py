"""Chat messages as every wire format maps them and every chat template reads them, and the
keys that decide whether two requests continue one token chain: a message's match key and the
tools key. Pure values: the ingress matches a client's echo against them, and the workers rebuild
prompts from what steps recorded with them. A message's images stand at character offsets of its
text; a template (and so a step's record) sees them as image parts named by their bytes' hash,
never the bytes."""

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


class MessageImage(BaseModel):
    """An image of a message's content (titoflow/tito/prompt_images.py): where it stands in the text
    (``at``, a character offset), what names its bytes (``sha256``, the engine's uuid for it),
    its upright size (which fixes its run of placeholder ids) and the URL it came as. Only the
    hash reaches a template or a recorded step, never the bytes."""

    model_config = ConfigDict(frozen=True)

    at: int
    sha256: str
    height: int
    width: int
    size: int = Field(0, description="Bytes of the encoded image (0: not known, as recorded).")
    url: str = Field("", description="The data: URL it came as (empty: not known, as recorded).")


class Message(BaseModel):
    model_config = ConfigDict(frozen=True)

    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    images: tuple[MessageImage, ...] = ()  # in content order; only user and tool messages

    def template_dict(
        self, arguments_text: bool = False, reasoning_key: str = "reasoning_content"
    ) -> dict[str, Any]:
        """The message as HF chat templates read it: tool-call arguments as a mapping, or as
        their JSON text for templates that write them as given (``arguments_text``); reasoning
        under the key the template reads (gpt-oss's reads ``thinking``)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.images:
            out["content"] = self._content_parts()
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

    def _content_parts(self) -> list[dict[str, Any]]:
        """The content as the parts a vision template reads: text, and each image named by
        its hash (the template writes one placeholder per image part, whatever it holds)."""
        parts: list[dict[str, Any]] = []
        start = 0
        for image in self.images:
            if image.at > start:
                parts.append({"type": "text", "text": self.content[start : image.at]})
            parts.append(
                {
                    "type": "image",
                    "image": f"sha256:{image.sha256}",
                    "size": [image.height, image.width],
                }
            )
            start = image.at
        if start < len(self.content):
            parts.append({"type": "text", "text": self.content[start:]})
        return parts

    @classmethod
    def from_template_dict(cls, message: dict[str, Any]) -> Message:
        """The inverse of :meth:`template_dict` (how steps record messages)."""
        content = message.get("content") or ""
        images: list[MessageImage] = []
        if isinstance(content, list):
            text = ""
            for part in content:
                if part.get("type") == "image":
                    height, width = part["size"]
                    sha256 = str(part["image"]).removeprefix("sha256:")
                    images.append(
                        MessageImage(at=len(text), sha256=sha256, height=height, width=width)
                    )
                else:
                    text += part.get("text", "")
            content = text
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
            content=content,
            reasoning=message.get("reasoning_content"),
            tool_calls=calls,
            tool_call_id=message.get("tool_call_id"),
            name=message.get("name"),
            images=tuple(images),
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
        key = (self.role, self.content, calls, self.tool_call_id)
        if self.images:  # the same text with other images (or elsewhere) is another message
            return (*key, tuple((image.at, image.sha256) for image in self.images))
        return key


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
