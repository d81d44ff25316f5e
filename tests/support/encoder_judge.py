"""A family's template held to a Python encoder, as vLLM's tokenizer mode for the family runs
the encoder in the engine environment (the judge where a model ships an encoder, not a
template): the cases (every prompt of the family corpus, each prefix ending where a prompt is
served, and each whole conversation, in chat and in thinking mode), the messages as vLLM's chat
parsing hands them to the tokenizer, and both renderings; which differences a family declares is
its test's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cli.dev.tokenizers import tokenizer_dir
from tests.support.corpus import corpus, expressible
from tests.support.engine_env import run_in_engine
from tests.support.families import family_tokenizer
from titoflow.tito.families import family_named
from titoflow.tito.messages import Message
from titoflow.tito.render import ChatRenderer

# The encoder script's body: ``tok`` is vLLM's tokenizer for the mode (set up by the caller's
# ``load`` line); a ValueError the encoder raises is its refusal.
_SCRIPT = """
import json, sys
request = json.load(sys.stdin)
{load}
out = []
for case in request["cases"]:
    try:
        text = tok.apply_chat_template(
            case["messages"],
            tools=case["tools"] or None,
            thinking=case["thinking"],
            tokenize=False,
            **case["variables"],
        )
        out.append(["text", text])
    except ValueError as exc:
        out.append(["refused", str(exc)])
print(json.dumps(out))
"""


@dataclass(frozen=True)
class Case:
    name: str
    messages: tuple[Message, ...]
    tools: tuple[Any, ...]
    thinking: bool
    variables: tuple[tuple[str, str], ...] = ()  # further template variables, given to both


@dataclass(frozen=True)
class Compared:
    case: Case
    ours: str
    verdict: str  # "text", or "refused" (then ``theirs`` is the encoder's message)
    theirs: str


def cases(family: str, toolless: bool = False) -> list[Case]:
    """The corpus's prompts in both modes; with ``toolless``, each conversation with tools once
    more without them (a template that renders history otherwise when the request has none)."""
    found = []
    for conversation in corpus():
        messages = expressible(family_named(family), conversation.messages)
        ends = {at + 1 for at, m in enumerate(messages) if m.role != "assistant"}
        tool_lists = [conversation.tools] + ([()] if toolless and conversation.tools else [])
        for tools in tool_lists:
            suffix = "" if tools == conversation.tools else "/no-tools"
            for end in sorted(ends | {len(messages)}):
                for thinking in (False, True):
                    mode = "thinking" if thinking else "chat"
                    name = f"{conversation.name}[:{end}]/{mode}{suffix}"
                    found.append(Case(name, messages[:end], tools, thinking))
    return found


def as_vllm_sends(message: Message) -> dict[str, Any]:
    """A message as vLLM's chat parsing hands it to the tokenizer: calls in OpenAI's shape with
    their arguments' JSON text, reasoning under both of vLLM's keys."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.reasoning is not None:
        out["reasoning"] = out["reasoning_content"] = message.reasoning
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def compare(
    family: str, load: str, toolless: bool = False, extra: Sequence[Case] = ()
) -> list[Compared]:
    """Every case of ``family`` (:func:`cases`, then ``extra``) rendered by its template
    (``enable_thinking`` the mode) and by the encoder (``thinking`` the mode), ``load`` the
    script lines that make ``tok`` from ``request["tokenizer"]``, the family's directory."""
    renderer = ChatRenderer(family_tokenizer(family))
    found = [*cases(family, toolless), *extra]
    request = {
        "tokenizer": str(tokenizer_dir(family)),
        "cases": [
            {
                "messages": [as_vllm_sends(m) for m in case.messages],
                "tools": list(case.tools),
                "thinking": case.thinking,
                "variables": dict(case.variables),
            }
            for case in found
        ],
    }
    verdicts = run_in_engine(_SCRIPT.format(load=load), request)
    return [
        Compared(
            case,
            renderer.render_text(
                case.messages,
                case.tools,
                {"enable_thinking": case.thinking, **dict(case.variables)},
                True,
            ),
            verdict,
            text,
        )
        for case, (verdict, text) in zip(found, verdicts, strict=True)
    ]
