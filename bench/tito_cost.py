"""Per-turn render + tokenize cost along a long agent conversation: TITO versus full re-render.

    .venv/bin/python bench/tito_cost.py [--turns 1 10 50 200] [--repeat 30]

One session of an agent loop (system prompt, two tools, each turn a tool call and a ~600-char
tool result) runs through the ingress core (:class:`ingress.service.ChatService`, the real Qwen3
tokenizer and chat template of the local model, an in-process engine answering a fixed tool
call, a publisher that drops events) up to the largest turn asked. At each asked turn it times,
on the same cached state:

- ``tito``: what the ingress does before calling the engine on a cache hit (find the chain the
  request extends, render and tokenize only the new messages, derive the step id);
- ``full``: rendering and tokenizing the whole conversation, what a proxy without a token cache
  (or the ingress on a miss) does.

Each figure is the median of ``--repeat`` runs; the ratio to turn 10 shows how each grows.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from bench.engine_double import REPLY
from bench.harness import command_line, write_results
from bench.overhead import SYSTEM, TOOLS, tool_output
from ingress.chains import ChainStore
from ingress.service import ChatService, ServiceOptions, SessionEvent
from ingress.turn import ChatTurn, SessionRef
from titoflow.engine.api import GenerateParams, Generation
from titoflow.settings import Settings
from titoflow.tito.messages import Message
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


def median_ms(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


async def measure(turns: list[int], repeat: int) -> list[dict[str, Any]]:
    tokenizer = load_tokenizer(Settings().model_path)
    renderer = ChatRenderer(tokenizer)
    completion = [*tokenizer.encode(REPLY, add_special_tokens=False), renderer.terminator_id]
    service = ChatService(
        renderer=renderer,
        tokenizer=tokenizer,
        engine=FixedEngine(completion),  # type: ignore[arg-type]  # generate is all complete uses
        publish=_drop,
        chains=ChainStore(16),
        options=ServiceOptions(max_model_len=10_000_000, default_max_tokens=64),
    )
    session = SessionRef(session_id="tito-cost")
    messages: list[Message] = [
        Message(role="system", content=SYSTEM),
        Message(role="user", content="Task: the test test_handler fails; find out why."),
    ]
    rows = []
    for turn in range(1, max(turns) + 1):
        request = ChatTurn(
            session=session,
            api="openai.chat",
            model="policy",
            messages=tuple(messages),
            tools=TOOLS,
        )
        if turn in turns:
            prompt_tokens = len(renderer.full_prompt(request.messages, TOOLS, {}))
            tito = median_ms(lambda r=request: service._prepare(r), repeat) if turn > 1 else None
            full = median_ms(lambda r=request: renderer.full_prompt(r.messages, TOOLS, {}), repeat)
            rows.append(
                {
                    "turn": turn,
                    "messages": len(messages),
                    "prompt_tokens": prompt_tokens,
                    "tito_ms": None if tito is None else round(tito, 3),
                    "full_ms": round(full, 3),
                }
            )
            print(rows[-1], flush=True)
        result = await service.complete(request)
        answer = result.parsed.tool_calls[0]
        messages.append(Message(role="assistant", tool_calls=(answer,)))
        messages.append(
            Message(role="tool", content=tool_output(0, turn, 600), tool_call_id=answer.id)
        )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    base = next((r for r in rows if r["turn"] == 10), rows[0])
    lines = [
        f"{'turn':>5} {'messages':>8} {'prompt tok':>10} {'tito ms':>8} {'full ms':>8} "
        f"{'tito/turn10':>11} {'full/turn10':>11}"
    ]
    for r in rows:
        tito = r["tito_ms"]
        tito_ratio = f"{tito / base['tito_ms']:.2f}" if tito and base["tito_ms"] else ""
        lines.append(
            f"{r['turn']:>5} {r['messages']:>8} {r['prompt_tokens']:>10} "
            f"{'' if tito is None else tito:>8} {r['full_ms']:>8} {tito_ratio:>11} "
            f"{r['full_ms'] / base['full_ms']:>11.2f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, nargs="+", default=[1, 10, 50, 200])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--name", default="tito_cost")
    args = parser.parse_args()
    rows = asyncio.run(measure(sorted(args.turns), args.repeat))
    write_results(args.name, command_line(), {"rows": rows, "repeat": args.repeat}, table(rows))


if __name__ == "__main__":
    main()
