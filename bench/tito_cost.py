"""Per-turn render + tokenize cost along a long agent conversation: TITO versus full re-render.

    .venv/bin/python -m bench.tito_cost [--turns 1 10 50 200] [--repeat 30] [--family F ...|all]
        [--tools two claude-code]

One session of an agent loop (system prompt, two tools, each turn a tool call and a ~600-char
tool result) runs through the ingress core (:class:`ingress.turns.service.ChatService`, a family's
tokenizer and chat template — by default the local model's, else those of
``cli/dev/tokenizers`` — an in-process engine answering a fixed tool call in the family's
format, a publisher that drops events) up to the largest turn asked. At each asked turn it
times, on the same cached state:

- ``tito``: what the ingress does before calling the engine on a cache hit (find the chain the
  request extends, render and tokenize only the new messages, derive the step id);
- ``full``: rendering and tokenizing the whole conversation, what a proxy without a token cache
  (or the ingress on a miss) does.

Each asked turn's cached state is kept under a session of its own and all are timed at the end,
interleaved (one run of each turn per round, ``--repeat`` rounds): the figure is the median, and
the ratio to turn 10 shows how each grows, free of the machine's drift during the run.
With ``--family``, each family runs the same session in the same process, one after another.
With ``--tools``, each tool list does: ``two`` (bench/overhead.py's two tools) or ``claude-code``
(Claude Code's default list as captured in bench/captures: 24 tools, 64 KB of JSON), and the table
shows each list's TITO cost over the two tools' at the same turn.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import dataclass
from typing import Any

from bench.engine_double import ARGUMENTS, TOOL
from bench.harness import claude_code_tools, command_line, write_results
from bench.overhead import SYSTEM, TOOLS, tool_output
from cli.dev.tokenizers import SOURCES, tokenizer_dir
from ingress.turns.chains import ChainStore
from ingress.turns.service import ChatService, ServiceOptions, SessionEvent
from ingress.turns.turn import ChatTurn, SessionRef
from titoflow.engine.api import GenerateParams, Generation
from titoflow.settings import Settings
from titoflow.tito.families import NAMES
from titoflow.tito.messages import Message, ToolCall
from titoflow.tito.render import ChatRenderer
from titoflow.tito.tokenizer import load_tokenizer


class FixedEngine:
    """In-process engine answering the same completion at once (no engine is measured here)."""

    url = "inprocess://fixed"

    def __init__(self, completion: list[int]) -> None:
        self.completion = completion

    async def generate(
        self, prompt_ids: list[int], params: GenerateParams, request_id: str, session_id: str = ""
    ) -> Generation:
        return Generation(
            token_ids=self.completion,
            logprobs=[-0.25] * len(self.completion),
            finish_reason="stop",
            request_id=request_id,
            engine_url=self.url,
        )


async def _drop(event: SessionEvent) -> None:
    return None


def elapsed_ms(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


OPENING = (
    Message(role="system", content=SYSTEM),
    Message(role="user", content="Task: the test test_handler fails; find out why."),
)


TOOL_LISTS = {"two": lambda: TOOLS, "claude-code": claude_code_tools}


def reply_ids(
    renderer: ChatRenderer, history: tuple[Message, ...], tools: tuple[dict[str, Any], ...]
) -> list[int]:
    """The fixed tool call in the family's own format: the template's rendering of it after
    ``history``, through the turn's end token (what the model would generate)."""
    native = renderer.family.native_call_id  # Kimi's and Mistral's ids are the model's own
    call_id = native(TOOL, 0) if native else "call_0"
    call = ToolCall(id=call_id, name=TOOL, arguments=json.dumps(ARGUMENTS))
    answer = Message(role="assistant", tool_calls=(call,))
    prompt = renderer.full_prompt(history, tools, {})
    full = renderer.full_prompt([*history, answer], tools, {}, add_generation_prompt=False)
    if full[: len(prompt)] != prompt and renderer.family.reasoning_opener:
        # The prompt opened reasoning the template writes back only when there is some
        # (MiniMax-M2's): the model's call follows a short reasoning block.
        answer = answer.model_copy(update={"reasoning": "Call it."})
        full = renderer.full_prompt([*history, answer], tools, {}, add_generation_prompt=False)
    result = Message(role="tool", content="ok", tool_call_id=call.id)
    if full[: len(prompt)] != prompt and renderer.family.reasoning_tags:
        # A template that writes a final assistant message as a prefill of the generation
        # prompt (Nemotron Nano v2's): the turn as it writes it once the result follows,
        # after the reasoning block the prompt opened, closed.
        bare = renderer.full_prompt(history, tools, {}, add_generation_prompt=False)
        opening, closing = renderer.family.reasoning_tags
        head = renderer.tokenizer.decode(prompt[len(bare) :])
        head = head[: head.rindex(opening)]
        written = renderer.full_prompt([*history, answer, result], tools, {}, False)
        turn = str(renderer.tokenizer.decode(written[len(bare) :]))[len(head) :]
        rest = renderer.encode(f"Call it.{closing}\n\n{turn}")
        return rest[: next(i for i, t in enumerate(rest) if t in renderer.end_ids) + 1]
    rest = full[len(prompt) :]
    end = next((i for i, token in enumerate(rest) if token in renderer.end_ids), None)
    if end is None:  # GLM ends a turn at the next message's opener: the tool result's
        after = renderer.full_prompt([*history, answer, result], tools, {}, False)
        return [*rest, next(t for t in after[len(full) :] if t in renderer.end_ids)]
    return rest[: end + 1]


@dataclass
class Session:
    """One family's session under one tool list, played up to the largest asked turn: each
    asked turn's request, its cached state kept under a session of its own."""

    family: str
    tool_list: str
    tools: tuple[dict[str, Any], ...]
    renderer: ChatRenderer
    service: ChatService
    asked: dict[int, ChatTurn]
    prompt_tokens: dict[int, int]


def doubled_service(
    tools: tuple[dict[str, Any], ...], family: str | None = None, sessions: int = 16
) -> tuple[ChatRenderer, ChatService]:
    """A service of ``family``'s policy (None: the local model) on the :class:`FixedEngine`
    double, its steps dropped, its chain cache holding ``sessions`` sessions."""
    model = Settings().model_path if family is None else tokenizer_dir(family)
    tokenizer = load_tokenizer(model)
    renderer = ChatRenderer(tokenizer)
    service = ChatService(
        renderer=renderer,
        tokenizer=tokenizer,
        engine=FixedEngine(reply_ids(renderer, OPENING, tools)),  # type: ignore[arg-type]  # generate is all complete uses
        publish=_drop,
        chains=ChainStore(sessions),
        options=ServiceOptions(max_model_len=10_000_000, default_max_tokens=64),
    )
    return renderer, service


async def play(turns: list[int], family: str | None, tool_list: str) -> Session:
    tools = TOOL_LISTS[tool_list]()
    renderer, service = doubled_service(tools, family)
    session = SessionRef(session_id="tito-cost")
    messages = list(OPENING)
    asked: dict[int, ChatTurn] = {}
    prompt_tokens: dict[int, int] = {}
    for turn in range(1, max(turns) + 1):
        request = ChatTurn(
            session=session,
            api="openai.chat",
            model="policy",
            messages=tuple(messages),
            tools=tools,
        )
        if turn in turns:
            # The turn's cached state kept under a session of its own, so every asked turn is
            # timed at the end, interleaved: the machine's drift over the run is not growth.
            own = SessionRef(session_id=f"tito-cost-{turn}")
            found = service.chains.find(
                session.session_id, request.messages, request.tools_digest, "strict"
            )
            if found is not None:
                service.chains.advance(own.session_id, None, found[0])
            asked[turn] = request.model_copy(update={"session": own})
            prompt_tokens[turn] = len(renderer.full_prompt(request.messages, tools, {}))
        [result] = await service.complete(request)
        answer = result.parsed.tool_calls[0]
        messages.append(Message(role="assistant", tool_calls=(answer,)))
        messages.append(
            Message(role="tool", content=tool_output(0, turn, 600), tool_call_id=answer.id)
        )
    name = renderer.family.name
    return Session(name, tool_list, tools, renderer, service, asked, prompt_tokens)


def measure(sessions: list[Session], repeat: int) -> list[dict[str, Any]]:
    """Every session's asked turns timed ``repeat`` times, interleaved across sessions and
    turns (the TITO turns; the full renders apart: an 80 ms render between two TITO turns leaves
    the next one with cold caches); medians."""
    tito: dict[tuple[int, int], list[float]] = {
        (i, t): [] for i, s in enumerate(sessions) for t in s.asked if t > 1
    }
    full: dict[tuple[int, int], list[float]] = {
        (i, t): [] for i, s in enumerate(sessions) for t in s.asked
    }
    for _ in range(repeat):
        for i, turn in tito:
            s, request = sessions[i], sessions[i].asked[turn]
            tito[i, turn].append(
                elapsed_ms(lambda s=s, r=request: s.service.prompts.for_turn_now(r))
            )
    for _ in range(repeat):
        for i, turn in full:
            s, request = sessions[i], sessions[i].asked[turn]
            full[i, turn].append(
                elapsed_ms(lambda s=s, r=request: s.renderer.full_prompt(r.messages, s.tools, {}))
            )
    rows = []
    for i, s in enumerate(sessions):
        for turn, request in s.asked.items():
            times = tito.get((i, turn))
            rows.append(
                {
                    "family": s.family,
                    "tools": s.tool_list,
                    "turn": turn,
                    "messages": len(request.messages),
                    "prompt_tokens": s.prompt_tokens[turn],
                    "tito_ms": round(statistics.median(times), 3) if times else None,
                    "full_ms": round(statistics.median(full[i, turn]), 3),
                }
            )
            print(rows[-1], flush=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'family':>12} {'tools':>11} {'turn':>5} {'messages':>8} {'prompt tok':>10} "
        f"{'tito ms':>8} {'full ms':>8} {'tito/turn10':>11} {'full/turn10':>11} "
        f"{'tito/two':>8}"
    ]
    for r in rows:
        own = [o for o in rows if o["family"] == r["family"] and o["tools"] == r["tools"]]
        base = next((o for o in own if o["turn"] == 10), own[0])
        two = next(
            (
                o
                for o in rows
                if o["family"] == r["family"] and o["tools"] == "two" and o["turn"] == r["turn"]
            ),
            None,
        )
        tito = r["tito_ms"]
        tito_ratio = f"{tito / base['tito_ms']:.2f}" if tito and base["tito_ms"] else ""
        to_two = f"{tito / two['tito_ms']:.2f}" if tito and two and two["tito_ms"] else ""
        lines.append(
            f"{r['family']:>12} {r['tools']:>11} {r['turn']:>5} {r['messages']:>8} "
            f"{r['prompt_tokens']:>10} {'' if tito is None else tito:>8} {r['full_ms']:>8} "
            f"{tito_ratio:>11} {r['full_ms'] / base['full_ms']:>11.2f} {to_two:>8}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, nargs="+", default=[1, 10, 50, 200])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--name", default="tito_cost")
    parser.add_argument(
        "--family",
        nargs="+",
        default=None,
        help="Families to measure (their tokenizer recipes), or 'all'; default: the local model.",
    )
    parser.add_argument(
        "--tools", nargs="+", default=["two"], choices=sorted(TOOL_LISTS), help="tool lists"
    )
    args = parser.parse_args()
    families: list[str | None] = [None]
    if args.family:
        families = [f for f in NAMES if f in SOURCES] if args.family == ["all"] else args.family
    turns = sorted(args.turns)
    sessions = [
        asyncio.run(play(turns, family, tool_list))
        for family in families
        for tool_list in args.tools
    ]
    rows = measure(sessions, args.repeat)
    write_results(args.name, command_line(), {"rows": rows, "repeat": args.repeat}, table(rows))


if __name__ == "__main__":
    main()
