"""The shared corpus of multi-turn agent conversations every model family is proven on.

Each conversation is what a scaffold sends over its life: a system prompt, a task, assistant
turns that reason (or not), call tools (one, several in parallel, with empty, nested, boolean,
numeric, null and unicode arguments), tool results (errors among them), further user turns and a
system message that changes mid-conversation; the longest runs 40 turns. Conversations are
built from a seed, so the corpus is the same on every machine.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from titoflow.tito.families.base import Family
from titoflow.tito.messages import Message, ToolCall

# A string argument no template rewrites: the malformed-output test cuts a call inside it.
PROBE = "probe-value-7f3a"


def tool(name: str, properties: dict[str, Any], required: list[str] | None = None) -> Any:
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    return {
        "type": "function",
        "function": {"name": name, "description": f"The {name} tool.", "parameters": parameters},
    }


TOOLS = (
    tool("read_file", {"path": {"type": "string"}}, ["path"]),
    tool(
        "run",
        {
            "command": {"type": "string"},
            "timeout": {"type": "integer"},
            "background": {"type": "boolean"},
        },
        ["command"],
    ),
    tool(
        "edit",
        {
            "path": {"type": "string"},
            "changes": {"type": "array", "items": {"type": "object"}},
            "options": {"type": "object"},
        },
    ),
    tool("list_dir", {}),
)

ARGUMENTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("read_file", {"path": "README.md"}),
    ("read_file", {"path": f"src/{PROBE}.py"}),
    ("run", {"command": "pytest -x", "timeout": 120, "background": False}),
    ("run", {"command": "echo 'naïve café 漢字 🙂' \"quoted\"", "background": True}),
    ("list_dir", {}),
    (
        "edit",
        {
            "path": "a/b.py",
            "changes": [{"line": 3, "text": 'x = {"k": [1, 2.5, null]}'}, {"line": 9}],
            "options": {"dry_run": False, "nested": {"deep": [True, None, "ü"]}},
        },
    ),
    ("run", {"command": "ls -la\ncat x | head -n 5", "timeout": 0}),
)

REASONING = (
    "The user wants the tests fixed. First read the file.",
    "Two files matter here; read both at once.",
    "The run failed: an import error. Édit the module, then re-run.",
)

RESULTS = (
    "# titoflow\n\nTrajectory capture.",
    "Error: command exited with status 1\nImportError: no module named 'x'",
    "",
    "total 8\ndrwxr-xr-x  2 root root 4096 .\n-rw-r--r--  1 root root   12 a.py",
    '{"ok": true, "items": [1, 2, 3]}',
)


@dataclass(frozen=True)
class Conversation:
    name: str
    messages: tuple[Message, ...]
    tools: tuple[Any, ...]
    thinking: bool  # assistant turns carry reasoning (rendered with the family's thinking on)


def _call(rng: random.Random, index: int) -> ToolCall:
    name, arguments = ARGUMENTS[rng.randrange(len(ARGUMENTS))]
    return ToolCall(id=f"call_{index}", name=name, arguments=json.dumps(arguments))


def _agent_loop(seed: int, turns: int, thinking: bool, parallel: int, system_change: bool) -> Any:
    rng = random.Random(seed)
    messages: list[Message] = [
        Message(role="system", content="You are a careful coding agent. Use the tools."),
        Message(role="user", content="Fix the failing test in  src/app.py, please.\n"),
    ]
    calls = 0
    for turn in range(turns):
        reasoning = REASONING[turn % len(REASONING)] if thinking else None
        last = turn == turns - 1
        if last or rng.random() < 0.15:
            answer = "Done: the test passes now." if last else "Looking further."
            messages.append(Message(role="assistant", content=answer, reasoning=reasoning))
            if not last:
                messages.append(Message(role="user", content="Go on. Also check `docs/`."))
            continue
        n = 1 + (rng.randrange(parallel) if parallel > 1 else 0)
        batch = [_call(rng, calls + i) for i in range(n)]
        calls += n
        content = "" if rng.random() < 0.6 else "Let me check."
        messages.append(
            Message(role="assistant", content=content, reasoning=reasoning, tool_calls=tuple(batch))
        )
        for call in batch:
            result = RESULTS[rng.randrange(len(RESULTS))]
            messages.append(Message(role="tool", content=result, tool_call_id=call.id))
        if system_change and turn == turns // 2:
            messages.append(Message(role="user", content="Status?"))
            messages.append(Message(role="system", content="Reminder: the user is waiting."))
    return tuple(messages)


def corpus() -> list[Conversation]:
    out = [
        Conversation(
            "chat",
            (
                Message(role="user", content="hi"),
                Message(role="assistant", content="Hello! How can I help?"),
                Message(role="user", content="Say  bye\n\n please."),
                Message(role="assistant", content="Bye."),
                Message(role="user", content="🙂"),
                Message(role="assistant", content="🙂"),
            ),
            (),
            False,
        )
    ]
    for thinking in (False, True):
        suffix = "thinking" if thinking else "plain"
        out += [
            Conversation(f"tools-{suffix}", _agent_loop(1, 6, thinking, 1, False), TOOLS, thinking),
            Conversation(
                f"parallel-{suffix}", _agent_loop(2, 6, thinking, 3, False), TOOLS, thinking
            ),
            Conversation(
                f"system-change-{suffix}", _agent_loop(3, 6, thinking, 2, True), TOOLS, thinking
            ),
        ]
    out.append(Conversation("long-40", _agent_loop(4, 40, False, 2, False), TOOLS, False))
    return out


def expressible(family: Family, messages: Sequence[Message]) -> tuple[Message, ...]:
    """The messages as the family's template can write them: at most its calls per turn (the
    results of the others dropped), no text beside calls where it has none, no system message
    after the first where it refuses one."""
    limit, dropped = family.max_calls_per_turn, set()
    out: list[Message] = []
    for message in messages:
        if message.tool_call_id in dropped:
            continue
        if message.role == "system" and out and not family.later_system:
            continue
        if message.tool_calls and limit is not None:
            dropped |= {call.id for call in message.tool_calls[limit:]}
            message = message.model_copy(update={"tool_calls": message.tool_calls[:limit]})
        if message.tool_calls and not family.content_with_calls:
            message = message.model_copy(update={"content": ""})
        out.append(message)
    return tuple(out)
