"""Reasoning and tool calls out of generated text (Qwen3/Hermes family).

A malformed tool call is never repaired or dropped: the text goes back to the client as it is and
the step records the parse error. Parsing works on decoded text only; the recorded tokens are
the engine's.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field

from ingress.turn import ToolCall

_THINK = re.compile(r"^\s*(?:<think>)?(.*?)</think>\s*", re.DOTALL)
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ParsedOutput:
    content: str
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    parse_error: str | None = None


def tool_call_id(step_id: str, index: int) -> str:
    """Deterministic, so a replayed or retried step shows the client the same ids."""
    return "call_" + hashlib.sha256(f"{step_id}/{index}".encode()).hexdigest()[:24]


def parse_output(text: str, step_id: str) -> ParsedOutput:
    reasoning = None
    match = _THINK.match(text)
    if match:
        reasoning = match.group(1).strip("\n")
        text = text[match.end() :]
    if "<tool_call>" not in text:
        return ParsedOutput(content=text, reasoning=reasoning)
    calls: list[ToolCall] = []
    for index, block in enumerate(_TOOL_CALL.findall(text)):
        try:
            payload = json.loads(block)
            name = payload["name"]
            arguments = payload.get("arguments", {})
            if not isinstance(name, str) or not isinstance(arguments, dict):
                raise TypeError("name must be a string and arguments an object")
        except (ValueError, KeyError, TypeError) as exc:
            return ParsedOutput(
                content=text, reasoning=reasoning, parse_error=f"tool call {index}: {exc}"
            )
        calls.append(
            ToolCall(id=tool_call_id(step_id, index), name=name, arguments=json.dumps(arguments))
        )
    unclosed = text.count("<tool_call>") != len(calls)
    if unclosed or not calls:
        return ParsedOutput(content=text, reasoning=reasoning, parse_error="unclosed <tool_call>")
    return ParsedOutput(
        content=text[: text.index("<tool_call>")].strip(), reasoning=reasoning, tool_calls=calls
    )
